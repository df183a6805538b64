"""Time-chunked companion (H-LRU) scan for a few long sequences: the passes of
``kernels/fused_gates/chunked.py`` on the companion recurrence.

As a dense recurrence the state is ``s_t = (h_t, h_{t-1}, …, h_{t-m+1})`` (newest first, the
layout of ``initial_state``) with ``s_t = C_t s_{t-1} + e_0 a0_t v_t``, ``C_t`` the companion
matrix of ``a_t``. Per chunk:

1. ``companion_summary_kernel``: ``P_c = C_last … C_first`` and the end state from zero ``E_c``
   by running the companion recurrence itself on ``m + 1`` columns at once: column ``j`` starts
   from ``s = e_j`` with no input (``P``'s column ``j``), the last from zero with the input
   (``E``). Each step costs ``O(m (m + 1))`` per channel (a row of ``C_t`` times the ring of the
   last ``m`` outputs of every column), not the ``m^3`` of a dense product.
2. The carries ``X_c = P_c X_{c-1} + E_c``: ``fused_gates``' kernel over a materialised ``P``
   (one ``m x m`` block per channel), chunks as steps; ``X_last`` is the final state.
3. ``companion_fwd_kernel`` with ``CHUNKED`` over each chunk from ``X_{c-1}``.

The backward: the adjoint of each chunk's start state from a zero end adjoint (``F_c``,
``companion_bwd_kernel`` with carries only), the reversed carries ``μ_{c-1} = P_c^T μ_c + F_c``
(``P^T`` written by the summary pass in that order), then each chunk again from ``μ_c`` with the
gradients. Time inside every kernel is the step within the sequence, so the ring slots and the
column permutation of the one-pass kernels carry over; the history ``h_{t-m} …`` a chunk needs
is read from ``h`` (or the initial state before the sequence's first step).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, next_pow2
from ..fused_gates.gate_math import gate_normalize
from ..fused_gates.kernels import _seq_bounds
from .kernels import UNROLL_MAX_M, _chunk_steps, _coef_cols

__all__ = ["companion_summary_kernel", "chunked_forward", "chunked_backward"]


@triton.jit
def _summary_step(Z, V, tok, j, R, re, o_n, o_c, m_n, mask, N, eps,
                  M: tl.constexpr, COL0: tl.constexpr, VARIANT: tl.constexpr):
    """Step ``j`` of the chunk (token ``tok``) on the rings ``R`` ``(slot, BN, column)`` (``P``)
    and ``re`` ``(slot, BN)`` (``E``). Slots count from the chunk's start (``h`` at chunk step
    ``j`` goes to slot ``j mod m``), so where ``j`` is a constexpr (the unrolled loop) the
    coefficient columns and the slot written are constants: no per-step index arithmetic, and the
    ring update is a register move, not ``MP x BN x MP`` selects. The slot axis comes first:
    Triton spreads threads over the last axes, so the sum over slots stays in each thread."""
    K1: tl.constexpr = M + COL0
    z = tl.load(Z + (tok * N + o_n[None, :]) * K1 + _coef_cols(j, o_c, M, COL0)[:, None], mask=mask,
                other=0.0).to(tl.float32)
    v = tl.load(V + tok * N + o_n, mask=m_n, other=0.0).to(tl.float32)
    if COL0 == 1:
        z0 = tl.load(Z + (tok * N + o_n) * K1, mask=m_n, other=0.0).to(tl.float32)
        w, w0, _g, _g0, _s, _s0 = gate_normalize(z, z0, mask, eps, 0, VARIANT)
        b = w0 * v
    else:
        w = z
        b = v
    slot = o_c == j % M
    y = tl.sum(w[:, :, None] * R, axis=0)
    R = tl.where(slot[:, None, None], y[None, :, :], R)
    ye = tl.sum(w * re, axis=0) + b
    re = tl.where(slot[:, None], ye[None, :], re)
    return R, re


@triton.jit(do_not_specialize=["T"])
def companion_summary_kernel(Z, V, P, PT, E, CU, T, N, CHUNK, eps,
                             M: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr,
                             COL0: tl.constexpr, VARIANT: tl.constexpr, NS: tl.constexpr,
                             IS_VARLEN: tl.constexpr, UNROLL: tl.constexpr):
    """Grid ``(num_seqs, channel groups, chunks)``: ``P``, ``PT`` ``(num_seqs, chunks, N, m, m)``
    (``PT``: ``P^T``, chunks reversed) and ``E`` ``(num_seqs, chunks, N, m)``, newest first.
    ``UNROLL``: ``m`` steps a loop trip (constant slots; the last ``Lc mod m`` steps one by one)."""
    i_n = tl.program_id(0)
    i_b = tl.program_id(1)
    bos, L = _seq_bounds(CU, i_n, T, IS_VARLEN)
    i_c, nch, s0, e0 = _chunk_steps(L, CHUNK, True)
    o_n = i_b * BN + tl.arange(0, BN)
    o_c = tl.arange(0, MP)
    m_n = o_n < N
    mask = (o_c < M)[:, None] & m_n[None, :]
    # column j starts from s = e_j, i.e. the history entry j + 1 steps before the chunk = 1
    # (chunk step -1-j, slot (-1-j) mod m)
    start = (o_c[:, None] == ((M - 1 - o_c) % M)[None, :]) & (o_c < M)[None, :]
    R = tl.zeros([MP, BN, MP], dtype=tl.float32) + start.to(tl.float32)[:, None, :]
    re = tl.zeros([MP, BN], dtype=tl.float32)
    Lc = e0 - s0
    tok0 = bos + s0
    if UNROLL:
        for p in tl.range(0, Lc // M, num_stages=NS):
            for u in tl.static_range(M):
                R, re = _summary_step(Z, V, tok0 + p * M + u, u, R, re, o_n, o_c, m_n, mask, N, eps,
                                      M, COL0, VARIANT)
        for j in range(Lc // M * M, Lc):
            R, re = _summary_step(Z, V, tok0 + j, j, R, re, o_n, o_c, m_n, mask, N, eps, M, COL0,
                                  VARIANT)
    else:
        for j in tl.range(0, Lc, num_stages=NS):
            R, re = _summary_step(Z, V, tok0 + j, j, R, re, o_n, o_c, m_n, mask, N, eps, M, COL0,
                                  VARIANT)
    # row i of the end state (h_{e0-1-i}, chunk step Lc-1-i) sits in slot (Lc-1-i) mod m
    row = ((Lc - 1 - o_c + M) % M)[:, None, None]
    col = o_c[None, None, :]
    k = i_n.to(tl.int64) * nch + i_c
    k_rev = k + nch - 1 - 2 * i_c
    ch = o_n[None, :, None].to(tl.int64)
    mask3 = mask[:, :, None] & (col < M)
    tl.store(P + (k * N + ch) * (M * M) + row * M + col, R, mask=mask3)
    tl.store(PT + (k_rev * N + ch) * (M * M) + col * M + row, R, mask=mask3)
    tl.store(E + (k * N + o_n[None, :]) * M + ((Lc - 1 - o_c + M) % M)[:, None], re, mask=mask)


def summary_config(N: int, m: int, tune: dict) -> tuple[int, int, bool, int]:
    """(BN channels a program, num_warps, unrolled, pipeline stages) of the summary: about 512
    ring entries ``MP x BN x MP`` a program; the loop unrolled by ``m`` steps up to
    ``UNROLL_MAX_M`` (16, the one-pass kernels' limit) with about 12 steps' loads in flight.
    ``tune`` keys ``sum_bn``, ``sum_warps``, ``sum_unroll`` (0 / 1), ``sum_stages`` override.
    Unrolled, sm_90 SASS (Triton 3.6) has 38 instructions a step at m = 8 (coefficients; 120
    with the step's slot a runtime value: the ring's selects and a second copy of the ring in
    another layout), 47 at m = 4 (123), 80 from logits at m = 8 (182)."""
    mp = max(2, next_pow2(m))
    bn = tune.get("sum_bn", max(1, min(next_pow2(N), 512 // (mp * mp))))
    elems = bn * mp * mp
    warps = tune.get("sum_warps", 1 if elems <= 256 else 2 if elems <= 1024 else 4 if elems <= 4096 else 8)
    unroll = bool(tune.get("sum_unroll", m <= UNROLL_MAX_M.value))
    return bn, warps, unroll, tune.get("sum_stages", max(2, -(-12 // m)) if unroll else 12)


def chunked_forward(fg_launch_fwd, fwd_kernel, z, v, h0, cu, T, N, m, col0, code, eps, chunk, nc,
                    cfg, unroll, out_fp32_final, out_dtype, tune, empty):
    """``(h, h_final | None, PT)``. ``fg_launch_fwd``: ``fused_gates.function._launch_fwd`` (the
    carries' scan); ``cfg``: the one-pass forward's ``(BN, MP, num_warps, stages)`` for
    ``num_seqs x chunks`` programs, ``unroll`` its ``UNROLL``; ``z``, ``v`` as the kernels read
    them."""
    nseq = cu.numel() - 1 if cu is not None else v.shape[0]
    mp = max(2, next_pow2(m))
    dev = v.device
    P = empty((nseq, nc, N, m, m), torch.float32, dev)
    PT = empty((nseq, nc, N, m, m), torch.float32, dev)
    E = empty((nseq, nc, N, m), torch.float32, dev)
    sbn, swarps, unroll, sstages = summary_config(N, m, tune)
    cu_arg = cu if cu is not None else v
    companion_summary_kernel[(nseq, cdiv(N, sbn), nc)](
        z, v, P, PT, E, cu_arg, T, N, chunk, eps, M=m, MP=mp, BN=sbn, COL0=col0, VARIANT=code,
        NS=sstages, IS_VARLEN=cu is not None, UNROLL=unroll, num_warps=swarps, num_stages=sstages)
    X, hf = fg_launch_fwd(P, E, h0, None, nc, N, m, 0, 5, 1.0, out_fp32_final, torch.float32)
    h = empty(v.shape, out_dtype, dev)
    bn, _, warps, stages = cfg
    fwd_kernel[(nseq, cdiv(N, bn), nc)](
        z, v, h0 if h0 is not None else X, h, X, cu_arg, X, T, N, chunk, eps, M=m, MP=mp, BN=bn,
        COL0=col0, VARIANT=code, NS=stages, HAS_H0=h0 is not None, STORE_HF=False,
        IS_VARLEN=cu is not None, CHUNKED=True, UNROLL=unroll, num_warps=warps, num_stages=stages)
    return h, hf, PT


def chunked_backward(fg_launch_fwd, bwd_kernel, z, v, h0, h, dh, dhf, PT, cu, T, N, m, col0,
                     code, eps, chunk, cfg, unroll, need_dh0, dz, dv, empty):
    """``dh0 | None``, writing ``dz``, ``dv``; ``cfg``: the one-pass backward's configuration
    for ``num_seqs x chunks`` programs (``unroll`` its ``UNROLL``), ``PT`` from
    ``chunked_forward``."""
    nseq, nc = PT.shape[0], PT.shape[1]
    bn, mp, warps, stages = cfg
    grid = (nseq, cdiv(N, bn), nc)
    cu_arg = cu if cu is not None else dh
    kw = dict(M=m, MP=mp, BN=bn, COL0=col0, VARIANT=code, NS=stages, HAS_H0=h0 is not None,
              IS_VARLEN=cu is not None, CHUNKED=True, UNROLL=unroll, num_warps=warps,
              num_stages=stages)
    F = empty((nseq, nc, N, m), torch.float32, v.device)  # chunks reversed, as PT
    bwd_kernel[grid](z, v, h0 if h0 is not None else h, h, dh, dh, dz, dv, F, cu_arg, F, T, N,
                     chunk, eps, HAS_DHF=False, STORE_DH0=True, HAS_XIN=False, STORE_GRADS=False, **kw)
    X, dh0 = fg_launch_fwd(PT, F, dhf, None, nc, N, m, 0, 5, 1.0, need_dh0, torch.float32)
    bwd_kernel[grid](z, v, h0 if h0 is not None else h, h, dh, dhf if dhf is not None else dh, dz,
                     dv, dv, cu_arg, X, T, N, chunk, eps, HAS_DHF=dhf is not None, STORE_DH0=False,
                     HAS_XIN=True, STORE_GRADS=True, **kw)
    return dh0
