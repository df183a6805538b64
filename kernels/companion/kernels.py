"""Triton kernels: companion (H-LRU) recurrence, O(m) per channel-step, newest component stored.

Each program owns ``BN`` channels of one sequence. The last ``m`` outputs live in a register
*ring* of ``m`` slots: ``h_τ`` sits in slot ``(τ + m) mod m``. At step ``t`` the ring holds
``h_{t-1} … h_{t-m}``, and slot ``c`` holds ``h_{t-i}`` for ``i = ((t − c − 1) mod m) + 1``: we
load the logits with that column permutation, so ``h_t = Σ_c a[c]·ring[c] + a0·v_t`` is one
elementwise product and one row reduction, and the new value overwrites slot ``t mod m``. No
register shuffles, no ``m x m`` matrix. With ``UNROLL`` (m <= 16; the backward from logits only
to m = 8) the loops run m steps per iteration from a step that is 0 mod m (the few steps before
and after it one by one), so each unrolled step's slot and column permutation are constants: no
index arithmetic, and the ring update is a register move rather than a select per slot (sm_90
SASS, Triton 3.6: 45 instead of 92 instructions a step at m = 8, 39 instead of 66 at m = 4); the
state-independent gate normalisation of one step overlaps the others' chain.

Layouts (contiguous): coefficients ``(tokens, N, K1)``, ``K1 = m + COL0`` (``COL0 = 1``: logits
with the input gate in column 0; ``COL0 = 0``: materialised ``a``, no gate, ``b`` in place of
``v``), ``v``/``h`` ``(tokens, N)``, states ``(num_seqs, N, m)`` newest first.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..fused_gates.gate_math import gate_normalize
from ..fused_gates.kernels import _seq_bounds


# the one-pass loops may run m steps a trip (constant ring slots, ``UNROLL``) up to this order;
# one step a trip above it (a 32-step unrolled body compiles slowly and gains little). The host
# picks ``UNROLL`` (``function._unrolled``)
UNROLL_MAX_M = tl.constexpr(16)


@triton.jit
def _coef_cols(t, o_c, M: tl.constexpr, COL0: tl.constexpr):
    """Column of the coefficient that multiplies ring slot ``c`` at step ``t``."""
    return (t - o_c - 1 + M) % M + COL0


@triton.jit
def _load_hist(HOUT, H0, bos, tau, o_n, mask, n64, N, M: tl.constexpr, HAS_H0: tl.constexpr):
    """h_τ for τ >= -m: the saved output for τ >= 0, else initial_state[..., -1-τ]."""
    tau = tau + o_n * 0  # broadcast to the tile (a scalar mask trips the interpreter)
    past = tau >= 0  # masked loads: nothing outside [bos, bos+L) is touched, even for L = 0
    x = tl.load(HOUT + (bos + tl.maximum(tau, 0)) * N + o_n, mask=mask & past,
                other=0.0).to(tl.float32)
    if HAS_H0:
        x0 = tl.load(H0 + (n64 * N + o_n) * M + tl.maximum(-1 - tau, 0), mask=mask & (tau < 0),
                     other=0.0).to(tl.float32)
    else:
        x0 = x * 0.0
    return tl.where(past, x, x0)


@triton.jit
def _fwd_step(Z, V, HOUT, bos, t, r, ring, o_n, o_c, m_n, mask, N, eps,
              M: tl.constexpr, COL0: tl.constexpr, VARIANT: tl.constexpr):
    """Step ``t``; ``r = t`` or a constexpr ``r = t mod m`` (then the slot and the coefficient
    columns are constants: no per-step index arithmetic or ring selects)."""
    K1: tl.constexpr = M + COL0
    tok = bos + t
    zp = Z + (tok * N + o_n[:, None]) * K1
    z = tl.load(zp + _coef_cols(r, o_c, M, COL0)[None, :], mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + tok * N + o_n, mask=m_n, other=0.0).to(tl.float32)
    if COL0 == 1:
        z0 = tl.load(Z + (tok * N + o_n) * K1, mask=m_n, other=0.0).to(tl.float32)
        w, w0, _g, _g0, _s, _s0 = gate_normalize(z, z0, mask, eps, 1, VARIANT)
        y = tl.sum(w * ring, axis=1) + w0 * v
    else:
        y = tl.sum(z * ring, axis=1) + v
    tl.store(HOUT + tok * N + o_n, y.to(HOUT.dtype.element_ty), mask=m_n)
    return tl.where((o_c == r % M)[None, :], y[:, None], ring)


@triton.jit
def _chunk_steps(L, CHUNK, CHUNKED: tl.constexpr):
    """``(i_c, chunks, s0, e0)``: the steps ``[s0, e0)`` of a sequence of ``L`` steps this program
    runs: all of them, or with ``CHUNKED`` chunk ``program_id(2)`` of ``CHUNK`` steps (``s0 = e0
    = L`` past the end: a varlen chunk grid is sized by the longest sequence)."""
    i_c = 0
    nch = 1
    s0 = 0
    e0 = L
    if CHUNKED:
        i_c = tl.program_id(2)
        nch = tl.num_programs(2)
        s0 = tl.minimum(i_c * CHUNK, L)
        e0 = tl.minimum(s0 + CHUNK, L)
    return i_c, nch, s0, e0


@triton.jit(do_not_specialize=["T"])
def companion_fwd_kernel(Z, V, H0, HOUT, HF, CU, XIN, T, N, CHUNK, eps,
                         M: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
                         COL0: tl.constexpr, VARIANT: tl.constexpr, NS: tl.constexpr,
                         HAS_H0: tl.constexpr, STORE_HF: tl.constexpr, IS_VARLEN: tl.constexpr,
                         CHUNKED: tl.constexpr = False, UNROLL: tl.constexpr = False):
    """Grid ``(num_seqs, channel groups)``, or with ``CHUNKED`` ``(num_seqs, channel groups,
    chunks)``: chunk ``c > 0`` starts from the state ``XIN (num_seqs, chunks, N, m)`` entry
    ``c - 1`` (newest first; ``chunked.py``). Time ``t`` is the step within the sequence.
    ``UNROLL`` (set by the host only where ``m <= UNROLL_MAX_M``): ``m`` steps a loop trip, else
    one."""
    i_n = tl.program_id(0)
    i_b = tl.program_id(1)
    bos, L = _seq_bounds(CU, i_n, T, IS_VARLEN)
    i_c, nch, s0, e0 = _chunk_steps(L, CHUNK, CHUNKED)
    o_n = i_b * BN + tl.arange(0, BN)
    o_c = tl.arange(0, MP)
    m_n = o_n < N
    mask = m_n[:, None] & (o_c < M)[None, :]
    n64 = i_n.to(tl.int64)
    ring = tl.zeros([BN, MP], dtype=tl.float32)
    if HAS_H0:  # slot c holds h_{c-m} = initial_state[m-1-c]
        ring = tl.load(H0 + (n64 * N + o_n[:, None]) * M + (M - 1 - o_c)[None, :], mask=mask,
                       other=0.0).to(tl.float32)
    if CHUNKED:
        if i_c > 0:  # slot c holds h_τ, τ ≡ c (mod m), τ in [s0-m, s0-1]: state[(s0-1-c) mod m]
            ring = tl.load(XIN + ((n64 * nch + i_c - 1) * N + o_n[:, None]) * M
                           + ((s0 - 1 - o_c + M) % M)[None, :], mask=mask, other=0.0)
    # m steps a loop trip from a step t1 = 0 (mod m), so each unrolled step's slot and coefficient
    # columns are constants; the steps before t1 (a chunk start not a multiple of m) and the last
    # (e0 - t1) mod m run one by one
    # (without UNROLL one step a trip)
    if UNROLL:
        t1 = tl.minimum(s0 + (M - s0 % M) % M, e0)
        for t in range(s0, t1):
            ring = _fwd_step(Z, V, HOUT, bos, t, t, ring, o_n, o_c, m_n, mask, N, eps, M, COL0,
                             VARIANT)
        for p in tl.range(0, (e0 - t1) // M, num_stages=NS):
            for u in tl.static_range(M):
                ring = _fwd_step(Z, V, HOUT, bos, t1 + p * M + u, u, ring, o_n, o_c, m_n, mask, N,
                                 eps, M, COL0, VARIANT)
        for t in range(e0 - (e0 - t1) % M, e0):
            ring = _fwd_step(Z, V, HOUT, bos, t, t, ring, o_n, o_c, m_n, mask, N, eps, M, COL0,
                             VARIANT)
    else:
        for t in tl.range(s0, e0, num_stages=NS):
            ring = _fwd_step(Z, V, HOUT, bos, t, t, ring, o_n, o_c, m_n, mask, N, eps, M, COL0,
                             VARIANT)
    if STORE_HF:  # final[k] = h_{L-1-k}, in slot (L-1-k+m) mod m  <=>  k = (L-1-c+m) mod m
        tl.store(HF + (n64 * N + o_n[:, None]) * M + ((L - 1 - o_c + M) % M)[None, :], ring,
                 mask=mask)


@triton.jit
def _bwd_step(Z, V, H0, HOUT, DH, DZ, DV, bos, t, r, ring, pend, o_n, o_c, m_n, mask, n64, N, eps,
              M: tl.constexpr, COL0: tl.constexpr, VARIANT: tl.constexpr, HAS_H0: tl.constexpr,
              STORE: tl.constexpr = True):
    """One adjoint step at ``t`` (``r`` as in ``_fwd_step``); ``STORE=False``: the pending sums
    alone (a chunk's carry, chunked.py)."""
    K1: tl.constexpr = M + COL0
    tok = bos + t
    slot = (o_c == r % M)[None, :]
    cols = _coef_cols(r, o_c, M, COL0)[None, :]
    zp = Z + (tok * N + o_n[:, None]) * K1
    z = tl.load(zp + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(DH + tok * N + o_n, mask=m_n, other=0.0).to(tl.float32)
    lam = g + tl.sum(tl.where(slot, pend, 0.0), axis=1)
    if not STORE:
        w = z
        if COL0 == 1:
            z0 = tl.load(Z + (tok * N + o_n) * K1, mask=m_n, other=0.0).to(tl.float32)
            w, _w0, _g, _g0, _s, _s0 = gate_normalize(z, z0, mask, eps, 1, VARIANT)
        return ring, tl.where(slot, 0.0, pend) + w * lam[:, None]
    hold = _load_hist(HOUT, H0, bos, t - M, o_n, m_n, n64, N, M, HAS_H0)  # h_{t-m}
    ring = tl.where(slot, hold[:, None], ring)
    if COL0 == 1:  # v enters the gradient only through the input gate (coefficients: db = λ)
        v = tl.load(V + tok * N + o_n, mask=m_n, other=0.0).to(tl.float32)
        z0 = tl.load(Z + (tok * N + o_n) * K1, mask=m_n, other=0.0).to(tl.float32)
        w, w0, gg, gg0, s, s0 = gate_normalize(z, z0, mask, eps, 1, VARIANT)
        y = tl.sum(w * ring, axis=1) + w0 * v
        dz = lam[:, None] * gg * (ring - s * y[:, None])
        dz0 = lam * gg0 * (v - s0 * y)
        tl.store(DZ + (tok * N + o_n) * K1, dz0.to(DZ.dtype.element_ty), mask=m_n)
        dv = lam * w0
    else:
        w = z
        dz = lam[:, None] * ring
        dv = lam
    tl.store(DV + tok * N + o_n, dv.to(DV.dtype.element_ty), mask=m_n)
    tl.store(DZ + (tok * N + o_n[:, None]) * K1 + cols, dz.to(DZ.dtype.element_ty), mask=mask)
    pend = tl.where(slot, 0.0, pend) + w * lam[:, None]
    return ring, pend


@triton.jit(do_not_specialize=["T"])
def companion_bwd_kernel(Z, V, H0, HOUT, DH, DHF, DZ, DV, DH0, CU, XIN, T, N, CHUNK, eps,
                         M: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
                         COL0: tl.constexpr, VARIANT: tl.constexpr, NS: tl.constexpr,
                         HAS_H0: tl.constexpr, HAS_DHF: tl.constexpr, STORE_DH0: tl.constexpr,
                         IS_VARLEN: tl.constexpr, CHUNKED: tl.constexpr = False,
                         HAS_XIN: tl.constexpr = False, STORE_GRADS: tl.constexpr = True,
                         UNROLL: tl.constexpr = False):
    """Adjoint λ_t = g_t + Σ_i a_{i,t+i} λ_{t+i}, run backwards with a ring of pending sums.

    ``pend`` slot ``(τ + m) mod m`` accumulates ``Σ a_{i,τ+i} λ_{τ+i}`` for the not yet visited
    ``τ``; after step 0 the slots of ``τ = -1 … -m`` hold the gradient of the initial state.
    The ring of past outputs ``h_{t-1} … h_{t-m}`` is refilled one value per step from ``h``.
    ``CHUNKED`` (grid ``(num_seqs, channel groups, chunks)``): steps ``[s0, e0)`` of chunk ``c``,
    the adjoint of its end state from ``DHF`` (last chunk) or, with ``HAS_XIN``, entry
    ``chunks - 2 - c`` of ``XIN`` (zero without); ``DH0`` entry ``(n, chunks - 1 - c)`` gets the
    adjoint of its start state. ``STORE_GRADS=False``: that carry only. ``UNROLL`` as in the
    forward.
    """
    i_n = tl.program_id(0)
    i_b = tl.program_id(1)
    bos, L = _seq_bounds(CU, i_n, T, IS_VARLEN)
    i_c, nch, s0, e0 = _chunk_steps(L, CHUNK, CHUNKED)
    o_n = i_b * BN + tl.arange(0, BN)
    o_c = tl.arange(0, MP)
    m_n = o_n < N
    mask = m_n[:, None] & (o_c < M)[None, :]
    n64 = i_n.to(tl.int64)
    pend = tl.zeros([BN, MP], dtype=tl.float32)
    k_end = ((e0 - 1 - o_c + M) % M)[None, :]  # dL/dh_{e0-1-k} in slot (e0-1-k) mod m
    if HAS_DHF:
        pend = tl.load(DHF + (n64 * N + o_n[:, None]) * M + k_end, mask=mask, other=0.0).to(tl.float32)
    if CHUNKED:
        if i_c < nch - 1:
            pend = tl.zeros([BN, MP], dtype=tl.float32)
            if HAS_XIN:
                pend = tl.load(XIN + ((n64 * nch + nch - 2 - i_c) * N + o_n[:, None]) * M + k_end,
                               mask=mask, other=0.0)
    # ring slot c: h_τ with τ in [e0-1-m, e0-2], τ ≡ c (mod m)
    base = (e0 - 1 + M) % M
    tau0 = e0 - 1 - M + (o_c - base + M) % M
    ring = pend * 0.0
    if STORE_GRADS:
        ring = _load_hist(HOUT, H0, bos, tau0[None, :], o_n[:, None], mask, n64, N, M, HAS_H0)
    if UNROLL:
        # backwards, m steps a loop trip below a step t2 = 0 (mod m) (constant slots and columns,
        # as in the forward); the steps from t2 up and the last ones above s0 run one by one
        t2 = tl.maximum(e0 - e0 % M, s0)
        for i in range(0, e0 - t2):
            t = e0 - 1 - i
            ring, pend = _bwd_step(Z, V, H0, HOUT, DH, DZ, DV, bos, t, t, ring, pend, o_n, o_c,
                                   m_n, mask, n64, N, eps, M, COL0, VARIANT, HAS_H0, STORE_GRADS)
        for p in tl.range(0, (t2 - s0) // M, num_stages=NS):
            for u in tl.static_range(M):
                ring, pend = _bwd_step(Z, V, H0, HOUT, DH, DZ, DV, bos, t2 - 1 - p * M - u,
                                       M - 1 - u, ring, pend, o_n, o_c, m_n, mask, n64, N, eps, M,
                                       COL0, VARIANT, HAS_H0, STORE_GRADS)
        for i in range(0, (t2 - s0) % M):
            t = s0 + (t2 - s0) % M - 1 - i
            ring, pend = _bwd_step(Z, V, H0, HOUT, DH, DZ, DV, bos, t, t, ring, pend, o_n, o_c,
                                   m_n, mask, n64, N, eps, M, COL0, VARIANT, HAS_H0, STORE_GRADS)
    else:  # one step a trip, pipelined (the forty-eighth session's code ran these steps in its
        # plain prologue loop, without cp.async buffers: H200 B8 T2048 logits m = 16 fwd+bwd
        # 3.64 ms, pipelined 1.93)
        for i in tl.range(0, e0 - s0, num_stages=NS):
            t = e0 - 1 - i
            ring, pend = _bwd_step(Z, V, H0, HOUT, DH, DZ, DV, bos, t, t, ring, pend, o_n, o_c,
                                   m_n, mask, n64, N, eps, M, COL0, VARIANT, HAS_H0, STORE_GRADS)
    if STORE_DH0:  # dL/dh_{s0-1-k} = pending of τ = s0-1-k, in slot (s0-1-k) mod m
        tl.store(DH0 + ((n64 * nch + nch - 1 - i_c) * N + o_n[:, None]) * M
                 + ((s0 - 1 - o_c + M) % M)[None, :], pend, mask=mask)
