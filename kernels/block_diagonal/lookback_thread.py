"""Single-pass decoupled look-back forward with one block per thread (``m <= 8``): the chunk
summaries of ``summary_thread.py`` and ``lookback_dot.py``'s look-back in one launch.

Where: opt-in, ``TUNE['bd_lookback'] = True`` (or ``"always"``) with ``TUNE['bdlb_kind'] =
"thread"`` (``lookback_dot.bd_lookback_forward`` hands the call here); forwards without gradients.

Why: the chunked forward (``scan._bd_forward``) reads ``A`` twice, once for the chunk summaries and
once for the re-run from the carries, so it cannot pass about 53 % of the one-read floor (README.md
"Thread summaries"). ``lookback_dot.py`` did both passes in one program, but its 64-step chunks of
tensor-core tiles left about 150 MB of ``A`` between a chunk's two reads, so the second came from
DRAM again (L2 hit rate 12 %). Here a tile is ``BH = 32 num_warps`` blocks x ``CHUNK`` steps
(default 16: 128 KB of ``A`` at ``m = 8``), each thread one block, so less of ``A`` streams
through between a chunk's two reads and the second may come from L2 (not measured yet).

Per program:

1. tile id from the int32 counter, chunk-major (``lookback._next_tile``: no deadlock);
2. chunk ``c > 0``: the summary ``P = A_{t1-1} .. A_{t0}``, ``E`` (zero-start end state), ``m^3 +
   m^2`` FMAs a step in the thread's registers (``summary_thread._step``), published with flag 1;
3. look back, newest first (one chunk a trip): flag 2 = inclusive end state (stop), 1 = aggregate
   ``x -> P x + E`` (compose: ``m^3`` FMAs), 0 = spin; or (``TUNE['lbt_walk'] = "forward"``)
   back over the flags alone, then forward through the aggregates (``m^2`` FMAs each);
4. publish the inclusive end state ``P x + E`` with flag 2 *before* the re-run (chunk 0 publishes
   its end state after its re-run, as it has no summary);
5. re-run the chunk from the carry, ``m^2`` FMAs a step, writing ``h`` (and ``h_final`` at the
   sequence's last chunk).

Buffers: ``status`` int32 ``(ntile + 1,)`` zeroed; ``vals`` fp32 ``(ntile, m^2 + 2m, BH)``: rows
``P`` (row-major), ``E``, then the inclusive state, lanes contiguous (coalesced). Memory ordering
as in ``lookback.py``: values, ``bar.sync``, release flag; acquire flag loads, ``ld.volatile``
values. Checked in the sm_90a PTX from Triton 3.6 (``tools/aot_check.py compile --ptx-dir``,
sixty-ninth session), m = 4, 6, 8: one ``ld.global.gpu.acquire`` flag load (broadcast between
``bar.sync``), ``m^2 + 2m`` ``ld.volatile`` value loads, and three publishes, each a ``bar.sync``
then ``atom.global.gpu.release.exch``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, max_seq_len
from .fwd import _seq_bounds
from .lookback import _next_tile
from .lookback4 import _publish4
from .summary_thread import (THREAD_MAX_M, _chunk_summary_thread, _identity_map, _load_entries, _load_step,
                             _step, _vec_width)

__all__ = ["bd_thread_lookback_cfg", "bd_thread_lookback_forward"]


@triton.jit
def _matvec(a, x, bt, M: tl.constexpr):
    """``a x + bt`` for a row-major ``M x M`` tuple ``a`` and ``M``-tuples ``x``, ``bt``."""
    out = ()
    for i in tl.static_range(M):
        acc = a[i * M] * x[0] + bt[i]
        for k in tl.static_range(1, M):
            acc = acc + a[i * M + k] * x[k]
        out = out + (acc,)
    return out


@triton.jit
def _store_entries(X, offs, ok, v, N: tl.constexpr, VW: tl.constexpr):
    """``X[offs + k] = v[k]`` for ``k < N`` per lane (``v`` an ``N``-tuple of ``(BH,)`` fp32), as
    ``VW``-wide (4 or 1) vector stores, cast to ``X``'s dtype."""
    if VW == 4:
        for q in tl.static_range(N // 4):
            w = tl.reshape(tl.join(tl.join(v[4 * q], v[4 * q + 2]), tl.join(v[4 * q + 1], v[4 * q + 3])),
                           (v[0].shape[0], 4))  # [.., k] = v[4q + k]
            tl.store(X + offs[:, None] + (4 * q + tl.arange(0, 4))[None, :],
                     w.to(X.dtype.element_ty), mask=ok[:, None])
    else:
        for k in tl.static_range(N):
            tl.store(X + offs + k, v[k].to(X.dtype.element_ty), mask=ok)


@triton.jit
def _load_rows(V, row0, K: tl.constexpr, BH: tl.constexpr, bh):
    """Rows ``row0 .. row0 + K - 1`` of a tile's values (row stride ``BH``) as a ``K``-tuple,
    volatile (L2: another program's values)."""
    out = ()
    for k in tl.static_range(K):
        out = out + (tl.load(V + (row0 + k) * BH + bh, volatile=True),)
    return out


@triton.jit
def _thread_look_back(Status, Vals, base, c, bh, M: tl.constexpr, BH: tl.constexpr):
    """Carry into chunk ``c`` (an ``M``-tuple) from chunks ``c-1, c-2, ..`` of one (sequence,
    block group): the map ``x_c = Pacc x + Eacc`` takes each aggregate ``(P_j, E_j)`` on its right
    until a chunk with its inclusive state (flag 2; chunk 0 always publishes one)."""
    MM: tl.constexpr = M * M
    ROWS: tl.constexpr = MM + 2 * M
    pacc, eacc = _identity_map(M, BH)
    j = c - 1
    done = c * 0
    while done == 0:
        fl = tl.atomic_add(Status + base + j, 0, sem="acquire", scope="gpu")
        vj = Vals + (base + j) * (ROWS * BH)
        if fl == 2:
            eacc = _matvec(pacc, _load_rows(vj, MM + M, M, BH, bh), eacc, M)
            done = done + 1
        elif fl == 1:  # (Pacc, Eacc) then (P_j, E_j) earlier: (Pacc P_j, Pacc E_j + Eacc)
            pacc, eacc = _step(_load_rows(vj, 0, MM, BH, bh), _load_rows(vj, MM, M, BH, bh),
                               pacc, eacc, M)
            j = j - 1
    return eacc


@triton.jit
def _thread_look_back_fwd(Status, Vals, base, c, bh, M: tl.constexpr, BH: tl.constexpr):
    """``_thread_look_back`` by another walk (``TUNE['lbt_walk'] = "forward"``): back over the
    flags alone to the newest chunk ``j`` with its inclusive state (flag 2; 1: go on, 0: spin),
    then forward from that state through the aggregates of ``j+1 .. c-1``, ``x <- P x + E``
    (``m^2`` FMAs a chunk against the compose's ``m^3``). Their values were published before the
    flags read here (acquire)."""
    MM: tl.constexpr = M * M
    ROWS: tl.constexpr = MM + 2 * M
    j = c - 1
    found = c * 0
    while found == 0:
        fl = tl.atomic_add(Status + base + j, 0, sem="acquire", scope="gpu")
        if fl == 2:
            found = found + 1
        elif fl == 1:
            j = j - 1
    x = _load_rows(Vals + (base + j) * (ROWS * BH), MM + M, M, BH, bh)
    for k in tl.range(j + 1, c):
        vk = Vals + (base + k) * (ROWS * BH)
        x = _matvec(_load_rows(vk, 0, MM, BH, bh), x, _load_rows(vk, MM, M, BH, bh), M)
    return x


@triton.jit(do_not_specialize=["T", "NC", "NSEQ"])
def _bd_thread_lookback_fwd(A, Bv, Hout, Init, Final, Status, Vals, CU, T, H, NC, NSEQ, CHUNK,
                            M: tl.constexpr, BH: tl.constexpr, VW: tl.constexpr, VWB: tl.constexpr,
                            VS: tl.constexpr, HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr,
                            VARLEN: tl.constexpr, PUBLISH_INCL: tl.constexpr, WALK_FWD: tl.constexpr):
    """``A`` rows ``(B*T, H, M, M)``, ``Bv``/``Hout`` rows ``(B*T, H, M)``; ``Init``/``Final``
    ``(nseq, H, M)``; ``Status`` int32 ``(ntile + 1,)`` zeroed, ``Vals (ntile, M*M + 2M, BH)``
    fp32. ``PUBLISH_INCL = False`` (tests only): chunks beyond 0 publish only aggregates, so every
    look-back walks to chunk 0. ``WALK_FWD``: ``_thread_look_back_fwd``'s walk."""
    MM: tl.constexpr = M * M
    GH = tl.cdiv(H, BH)
    c, s, pg, ntile = _next_tile(Status, NSEQ, GH, NC)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    bh = tl.arange(0, BH)
    hb = pg * BH + bh
    mh = hb < H
    base = (s.to(tl.int64) * GH + pg) * NC
    me = base + c
    vrow = Vals + me * ((MM + 2 * M) * BH) + bh
    so = (s.to(tl.int64) * H + hb) * M
    x = ()
    for k in tl.static_range(M):
        x = x + (tl.zeros([BH], tl.float32),)
    if c == 0:
        if HAS_INIT:
            x = _load_entries(Init, so, mh, M, 1)
    elif t0 < eos:
        P, E = _chunk_summary_thread(A, Bv, t0, t1, H, hb, mh, M, BH, VW, VWB)
        _publish4(Status, me, vrow, BH, P + E, 0, MM + M, 1)
        if WALK_FWD:
            x = _thread_look_back_fwd(Status, Vals, base, c, bh, M, BH)
        else:
            x = _thread_look_back(Status, Vals, base, c, bh, M, BH)
        if PUBLISH_INCL:  # the end state P x + E (this tile's own rows: its threads wrote them)
            _publish4(Status, me, vrow, BH, _matvec(P, x, E, M), MM + M, M, 2)
    if (t0 < eos) | (c == 0):  # empty chunks past a sequence's end (varlen) do nothing more
        a, bt = _load_step(A, Bv, t0, t1, H, hb, mh, M, VW, VWB)  # step t + 1 loads before step t
        for t in tl.range(t0, t1):
            an, bn = _load_step(A, Bv, t + 1, t1, H, hb, mh, M, VW, VWB)
            x = _matvec(a, x, bt, M)
            _store_entries(Hout, (t * H + hb) * M, mh, x, M, VS)
            a = an
            bt = bn
        if c == 0:  # chunk 0 has no summary: its end state after the re-run
            _publish4(Status, me, vrow, BH, x, MM + M, M, 2)
        if STORE_FINAL:
            if t1 == eos:  # the sequence's last chunk (chunk 0 of an empty sequence: h0)
                _store_entries(Final, so, mh, x, M, 1)


def bd_thread_lookback_cfg(tune: dict):
    """``(CHUNK, BH, num_warps, walk_forward)`` from ``TUNE['lbt_chunk']`` (16 steps a tile),
    ``TUNE['lbt_nw']`` (1 warp: 32 blocks a tile) and ``TUNE['lbt_walk']`` (``"compose"``, the
    default: ``_thread_look_back``; ``"forward"``: ``_thread_look_back_fwd``)."""
    ch, nw, walk = tune.get("lbt_chunk", 16), tune.get("lbt_nw", 1), tune.get("lbt_walk", "compose")
    if isinstance(ch, bool) or not isinstance(ch, int) or ch < 1:
        raise ValueError(f"TUNE['lbt_chunk'] must be a step count >= 1, got {ch!r}")
    if nw not in (1, 2, 4, 8):
        raise ValueError(f"TUNE['lbt_nw'] must be 1, 2, 4 or 8, got {nw!r}")
    if walk not in ("compose", "forward"):
        raise ValueError(f"TUNE['lbt_walk'] must be 'compose' or 'forward', got {walk!r}")
    return ch, 32 * nw, nw, walk == "forward"


def bd_thread_lookback_forward(A, b, h0, cu, tune, empty, max_len=None):
    """One launch. ``A (B, T, H, m, m)``, ``b (B, T, H, m)`` (``m <= 8``), ``h0 (nseq, H, m)`` or
    None, ``cu`` int64 offsets or None; ``empty`` allocates outputs (the launcher's NaN-poisoning
    ``_empty``). Returns ``(h, h_final, None)`` (``scan._bd_forward``'s contract: no chunk
    products, forward only)."""
    B, T, H, m = b.shape
    if not 1 <= m <= THREAD_MAX_M:
        raise ValueError(f"TUNE['bdlb_kind'] = 'thread' takes block sizes m <= {THREAD_MAX_M}, got m = {m}")
    nseq = B if cu is None else cu.numel() - 1
    ch, bh, nw, walk_fwd = bd_thread_lookback_cfg(tune)
    dev = b.device
    nc = max(1, cdiv(max_seq_len(T, cu, max_len), ch))  # >= 1: chunk 0 writes h0 of empty sequences
    ntile = nseq * cdiv(H, bh) * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)  # 0 = nothing published
    vals = empty((ntile, m * m + 2 * m, bh), torch.float32, dev)
    h = empty(b.shape, b.dtype, dev)
    final = empty((nseq, H, m), torch.float32, dev)
    if ntile:
        _bd_thread_lookback_fwd[(ntile,)](
            A, b, h, h0 if h0 is not None else b, final, status, vals, cu if cu is not None else b,
            T, H, nc, nseq, ch, M=m, BH=bh, VW=_vec_width(m * m), VWB=_vec_width(m),
            VS=4 if m % 4 == 0 else 1, HAS_INIT=h0 is not None, STORE_FINAL=True, VARLEN=cu is not None,
            PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)), WALK_FWD=walk_fwd,
            num_warps=nw, num_stages=1)
    return h, final, None
