"""The m = 1 (diagonal) scan with time contiguous: ``a, b, h`` of shape ``(B, N, T)``.

``diagonal_scan(a, b, time_dim=2)`` lands here. Each of the ``B * N`` rows is an independent
scalar recurrence ``h_t = a_t h_{t-1} + b_t`` stored as one contiguous run of ``T`` elements, so
a program owns ``BR`` whole rows and walks them in tiles of ``BT`` steps: every load and store is
a contiguous run of ``BT`` elements (16-byte vectors), the in-tile scan is ``tl.associative_scan``
along the row, and the carry between tiles is one float per row. Parallelism comes from the rows
alone (``B * N / BR`` programs), so there is no time-chunking: with fewer rows than SMs the
``(B, T, N)`` layout (look-back kernels) is the faster choice.

Backward (adjoint scan, ``math.md`` §4): ``mu_t = g_t + a_{t+1} mu_{t+1}`` from the end, with
``mu_{T-1} = g_{T-1} + dL/dh_T`` (the final state's gradient); ``db_t = mu_t``,
``da_t = mu_t h_{t-1}`` (``h_{-1} = h_0``) and ``dh_0 = a_0 mu_0``. The tiles run from the last to
the first; in a tile the reverse ``tl.associative_scan`` of the pairs ``(a_{t+1}, g_t)`` composes
with the carry ``mu`` of the tile to the right. ``a_{t+1}`` and ``h_{t-1}`` are loads shifted by one
element (scalar loads of the same cache lines).

A row's steps past its last whole ``BT`` tile run in tiles of ``BTT`` steps (``_cfg``: one tile
of the rest's next power of two), after the whole tiles in the forward and before them in the
backward: a scan tile costs the same instructions however many of its steps are masked, so
``T = 4104`` on 2048-step tiles alone ran three tiles' instructions for two tiles' bytes. Each
rest length's power of two (128 to ``BT``) is its own compiled variant.

With ``cu_seqlens`` the tensors are ``(1, N, T_total)`` and a program walks one sequence's range
of its rows. Offsets are int64. The kernels see the length only as the row stride ``RS`` (``T``,
or ``T_total``), which Triton specialises by divisibility by 16 (and the value 1), not by value;
the kernels also take ``TV = _host.row_divisor(T)`` (a constexpr) and rebuild ``RS`` as
``(RS // TV) * TV``, so rows of a length divisible by 4 or 8 keep 16-byte vectors too (one of
five variants per dtype; other lengths compile nothing new).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, next_pow2, num_sms, row_divisor
from .fwd import _affine_combine

# (BR rows, BT steps, num_warps, num_stages) of the forward and the backward; TUNE keys
# tm_br / tm_bt / tm_nw / tm_ns (tm_*_bwd for the backward). H100, against accelerated-scan in the
# same runs (RESULTS.md, 2026-11-27): one stage (no software pipelining) beat two and three.
TM_FWD = (1, 2048, 4, 1)
TM_BWD = (1, 2048, 4, 1)
# The forward takes 8 warps from this many programs per SM on (B8 T16384 N4096: 1.001x
# accelerated-scan's speed against 0.994x with 4; B1 T16384 N768, 5.8 programs per SM: 0.991x
# against 1.061x)
TM_FWD_NW8_FROM = 16
# The steps past a row's last whole BT tile run in one tile of the next power of two, at least
# this long (_cfg). H200, thirty-eighth session (RESULTS.md): a whole 2048-step tile for the 8
# steps past 4096 ran 1.47x the backward's instructions; several short tiles for a long rest were
# slower still (T6136 forward 0.66 ms on 512-step tiles against 0.56 on one 2048-step tile).
TM_TAIL_MIN = 128


@triton.jit
def _tm_rows(CU, s, pid, R, RS, BR: tl.constexpr, VARLEN: tl.constexpr):
    """Rows of program ``pid`` in sequence ``s``: row indices, their mask, the int64 offset of
    each row's time 0 as a ``(BR, 1)`` column, the sequence's int32 ``[bos, eos)`` and the rows'
    index in ``(num_seqs, R)``. Times within a row stay int32 (the launcher checks the length):
    one wide multiply-add per address instead of 64-bit adds."""
    rows = pid * BR + tl.arange(0, BR)
    mr = rows < R
    if VARLEN:
        bos = tl.load(CU + s).to(tl.int32)
        eos = tl.load(CU + s + 1).to(tl.int32)
        base = rows.to(tl.int64) * RS
    else:
        # RS (= T here) is specialised (divisible by 16 or not): a mask t < RS stays constant over
        # 16-element groups, which keeps the loads and stores 16-byte vectors (a mask on an
        # unspecialised T gave scalar accesses)
        bos = tl.zeros([], dtype=tl.int32)
        eos = bos + RS
        base = (s.to(tl.int64) * R + rows) * RS
    return rows, mr, base[:, None], bos, eos, s.to(tl.int64) * R + rows


@triton.jit
def _tm_row_vals(P, sr, mr, HAS: tl.constexpr, BR: tl.constexpr):
    """fp32 ``P[sr]`` for the program's rows (initial states, final-state gradients); zeros
    without ``P``."""
    x = tl.zeros([BR], dtype=tl.float32)
    if HAS:
        x = tl.load(P + sr, mask=mr, other=0.0).to(tl.float32)
    return x


@triton.jit
def _tm_fwd_tile(pa, pb, ph, ts, mr, eos, x, BT: tl.constexpr):
    """Steps ``[ts, ts + BT)`` (masked at ``eos``) of the program's rows from the carry ``x``
    (the state before ``ts``): stores ``h`` there and returns the state at the tile's end."""
    cols = tl.arange(0, BT)
    t = (ts + cols)[None, :]
    m2 = mr[:, None] & (t < eos)
    # padding (a, b) = (1, 0) carries the last state to the tile's end
    av = tl.load(pa + t, mask=m2, other=1.0).to(tl.float32)
    bv = tl.load(pb + t, mask=m2, other=0.0).to(tl.float32)
    ca, cb = tl.associative_scan((av, bv), 1, _affine_combine)
    h = ca * x[:, None] + cb
    tl.store(ph + t, h.to(ph.dtype.element_ty), mask=m2)
    return tl.sum(tl.where((cols == BT - 1)[None, :], h, 0.0), axis=1)


@triton.jit(do_not_specialize=["R"])
def _tm_fwd_kernel(Aa, Bv, Hout, Init, Final, CU, R, RS, BR: tl.constexpr, BT: tl.constexpr,
                   BTT: tl.constexpr, NS: tl.constexpr, HAS_INIT: tl.constexpr,
                   VARLEN: tl.constexpr, TV: tl.constexpr = 1):
    RS = (RS // TV) * TV  # the same stride, proven TV-aligned (module doc)
    pid = tl.program_id(0)
    s = tl.program_id(1)
    rows, mr, base, bos, eos, sr = _tm_rows(CU, s, pid, R, RS, BR, VARLEN)
    x = _tm_row_vals(Init, sr, mr, HAS_INIT, BR)
    pa, pb, ph = Aa + base, Bv + base, Hout + base
    tail = bos + ((eos - bos) // BT) * BT   # whole BT tiles, then the rest in BTT tiles (doc)
    for ts in tl.range(bos, tail, BT, num_stages=NS):
        x = _tm_fwd_tile(pa, pb, ph, ts, mr, eos, x, BT)
    for ts in tl.range(tail, eos, BTT):
        x = _tm_fwd_tile(pa, pb, ph, ts, mr, eos, x, BTT)
    tl.store(Final + sr, x, mask=mr)


@triton.jit
def _tm_bwd_tile(pa, ph, pg, pda, pdb, ts, mr, bos, eos, h0, mu_c, HAS_H0: tl.constexpr,
                 BT: tl.constexpr):
    """Steps ``[ts, ts + BT)`` (masked at ``eos``) of the adjoint scan from the carry ``mu_c``
    (``mu`` after the tile): stores ``db``, ``da`` there and returns ``mu`` at the tile's start."""
    cols = tl.arange(0, BT)
    t = (ts + cols)[None, :]
    m2 = mr[:, None] & (t < eos)
    g = tl.load(pg + t, mask=m2, other=0.0).to(tl.float32)
    # coefficient a_{t+1}; 1 at the sequence's last step, where the carry is dL/dh_T
    f = tl.load(pa + t + 1, mask=mr[:, None] & (t + 1 < eos), other=1.0).to(tl.float32)
    hp = tl.load(ph + t - 1, mask=m2 & (t > bos), other=0.0).to(tl.float32)
    if HAS_H0:
        hp = tl.where(t == bos, h0[:, None], hp)
    cf, cg = tl.associative_scan((f, g), 1, _affine_combine, reverse=True)
    mu = cf * mu_c[:, None] + cg
    tl.store(pdb + t, mu.to(pdb.dtype.element_ty), mask=m2)
    tl.store(pda + t, (mu * hp).to(pda.dtype.element_ty), mask=m2)
    return tl.sum(tl.where((cols == 0)[None, :], mu, 0.0), axis=1)


@triton.jit(do_not_specialize=["R"])
def _tm_bwd_kernel(Aa, Hs, H0, G, DhT, DA, DB, DH0, CU, R, RS, BR: tl.constexpr,
                   BT: tl.constexpr, BTT: tl.constexpr, NS: tl.constexpr, HAS_H0: tl.constexpr,
                   HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, TV: tl.constexpr = 1):
    RS = (RS // TV) * TV  # as the forward's
    pid = tl.program_id(0)
    s = tl.program_id(1)
    rows, mr, base, bos, eos, sr = _tm_rows(CU, s, pid, R, RS, BR, VARLEN)
    mu_c = _tm_row_vals(DhT, sr, mr, HAS_DHT, BR)
    h0 = _tm_row_vals(H0, sr, mr, HAS_H0, BR)
    pa, ph, pg, pda, pdb = Aa + base, Hs + base, G + base, DA + base, DB + base
    nt = (eos - bos) // BT
    tail = bos + nt * BT
    ntt = tl.cdiv(eos - tail, BTT)   # the rest past the whole tiles first, in BTT tiles
    for i in tl.range(0, ntt):
        mu_c = _tm_bwd_tile(pa, ph, pg, pda, pdb, tail + (ntt - 1 - i) * BTT, mr, bos, eos, h0,
                            mu_c, HAS_H0, BTT)
    for i in tl.range(0, nt, num_stages=NS):
        mu_c = _tm_bwd_tile(pa, ph, pg, pda, pdb, bos + (nt - 1 - i) * BT, mr, bos, eos, h0,
                            mu_c, HAS_H0, BT)
    # dh_0 = a_0 mu_0; an empty sequence passes dL/dh_T straight through (a = 1)
    a0 = tl.load(pa + bos, mask=(mr & ((bos + 0 * rows) < eos))[:, None], other=1.0).to(tl.float32)
    a0 = tl.sum(a0, axis=1)
    tl.store(DH0 + sr, a0 * mu_c, mask=mr)


def _cfg(tune: dict, T: int, bwd: bool, nprog: int = 0, nsm: int = 1, varlen: bool = False,
         itemsize: int = 4):
    """``(BR, BT, num_warps, num_stages, BTT)`` from ``TM_FWD``/``TM_BWD`` and ``tune``; ``BT``
    is in fp32 steps (twice as many for 2-byte ``itemsize``: the same bytes a tile; H200 bf16 B8
    T4096 N4096 forward 80 -> 88 % of copy, fwd+bwd 62 -> 64 %, thirty-eighth session), cut to
    the next power of two of ``T`` (at least 16) so short sequences do not scan padding;
    the forward has 8 warps with ``nprog`` (rows / BR x sequences) >= ``TM_FWD_NW8_FROM x nsm``.
    ``BTT`` is the tile of the ``T % BT`` steps past the last whole tile: one tile of the next
    power of two (at least ``TM_TAIL_MIN``); ``BT`` with no rest or with ``varlen`` (``T`` the
    longest sequence: the others' rests differ); TUNE ``tm_btt`` / ``tm_btt_bwd`` win."""
    d, sfx = (TM_BWD, "_bwd") if bwd else (TM_FWD, "")
    if not bwd and nprog >= TM_FWD_NW8_FROM * nsm:
        d = d[:2] + (8,) + d[3:]
    d = d[:1] + (d[1] * 4 // itemsize,) + d[2:]
    br, bt, nw, ns = (tune.get(f"tm_{k}{sfx}", v) for k, v in zip(("br", "bt", "nw", "ns"), d))
    bt = min(bt, max(16, next_pow2(T)))
    btt = bt if varlen or T % bt == 0 else max(TM_TAIL_MIN, next_pow2(T % bt))
    return br, bt, nw, ns, min(bt, tune.get(f"tm_btt{sfx}", btt))


def _rows_grid(B, N, br, cu):
    """``(R, grid)``: without ``cu_seqlens`` the ``B x N`` rows are one set of ``B * N`` rows (the
    same memory; no 65535 limit on the grid's second dim), with it ``N`` rows per sequence."""
    R, nseq = (B * N, 1) if cu is None else (N, cu.numel() - 1)
    return R, (cdiv(R, br), nseq)


def time_major_forward(a, b, h0, cu, max_len, tune, empty):
    """``a, b``: ``(B, N, T)`` contiguous (``B == 1`` with ``cu``); ``h0``: ``(num_seqs, N)`` or
    None. Returns ``h`` (``b``'s dtype) and the fp32 final state ``(num_seqs, N)``."""
    B, N, T = b.shape
    if T >= 2 ** 31 - 1:   # times within a row are int32 in the kernels
        raise ValueError(f"time_dim=2 takes sequences shorter than 2**31 - 1 steps, got T={T}")
    nseq = B if cu is None else cu.numel() - 1
    R, grid = _rows_grid(B, N, tune.get("tm_br", TM_FWD[0]), cu)   # the BR _cfg returns
    br, bt, nw, ns, btt = _cfg(tune, max_len, False, grid[0] * grid[1], num_sms(b.device),
                               cu is not None, b.element_size())
    h = empty(b.shape, b.dtype, b.device)
    final = empty((nseq, N), torch.float32, b.device)
    if final.numel():   # no rows: an empty grid is not launched (T = 0 still writes the final state)
        _tm_fwd_kernel[grid](
            a, b, h, h0 if h0 is not None else b, final, cu if cu is not None else b, R, T,
            BR=br, BT=bt, BTT=btt, NS=ns, HAS_INIT=h0 is not None, VARLEN=cu is not None,
            TV=row_divisor(T), num_warps=nw)
    return h, final


def time_major_backward(a, h, h0, g, dhT, cu, max_len, tune, empty):
    """Gradients ``(da, db, dh0)`` of ``time_major_forward`` from ``g = dL/dh`` and ``dhT``."""
    B, N, T = h.shape
    nseq = B if cu is None else cu.numel() - 1
    br, bt, nw, ns, btt = _cfg(tune, max_len, True, varlen=cu is not None,
                               itemsize=h.element_size())
    R, grid = _rows_grid(B, N, br, cu)
    da = empty(a.shape, a.dtype, a.device)
    db = empty(h.shape, h.dtype, h.device)
    dh0 = empty((nseq, N), torch.float32, h.device)
    if dh0.numel():
        _tm_bwd_kernel[grid](
            a, h, h0 if h0 is not None else h, g, dhT if dhT is not None else h, da, db, dh0,
            cu if cu is not None else h, R, T, BR=br, BT=bt, BTT=btt, NS=ns,
            HAS_H0=h0 is not None, HAS_DHT=dhT is not None, VARLEN=cu is not None,
            TV=row_divisor(T), num_warps=nw)
    return da, db, dh0


class TimeMajorScanFn(torch.autograd.Function):
    """Autograd for ``time_major_forward``: ``(a, b, h0, cu, max_len, tune, empty) -> (h, final)``."""

    @staticmethod
    def forward(ctx, a, b, h0, cu, max_len, tune, empty):
        h, final = time_major_forward(a, b, h0, cu, max_len, tune, empty)
        ctx.set_materialize_grads(False)  # an unused output's gradient is None (no zero fill)
        ctx.save_for_backward(a, h, h0, cu)
        ctx.max_len, ctx.tune, ctx.empty = max_len, tune, empty
        ctx.h0_dtype = None if h0 is None else h0.dtype
        return h, final

    @staticmethod
    def backward(ctx, dh, dfinal):
        a, h, h0, cu = ctx.saved_tensors
        g = torch.zeros_like(h) if dh is None else dh.contiguous()
        dhT = None if dfinal is None else dfinal.float().contiguous()
        da, db, dh0 = time_major_backward(a, h, h0, g, dhT, cu, ctx.max_len, ctx.tune, ctx.empty)
        return da, db, (dh0.to(ctx.h0_dtype) if h0 is not None else None), None, None, None, None
