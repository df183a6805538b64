"""Single-pass decoupled look-back forward for 2 x 2 blocks, the chunk scanned inside each thread.

Why (README.md "Few programs"): the sequential ring forward gives B8 T2048 N768 at ``m = 2`` only
96 one-warp programs, and its time is the same on an H100 and an H200 (the program, not DRAM, is
the bound). Here time is cut into chunks of ``CHUNK`` steps that are programs of their own
(12288 at that shape with the default 16-step chunks), and chunk carries pass through a status
buffer as in ``lookback.py`` (``m = 1``), so ``A`` and ``b`` are read once and ``h`` written once.

Per program (one tile = ``CHUNK`` steps x ``BH`` blocks of one sequence, ``BH = 32 num_warps``):

1. tile id from an int32 counter (``tl.atomic_add``), chunk-major, so a tile only waits on tiles
   handed out before it (``lookback.py`` explains why this cannot deadlock);
2. load the tile's ``A`` as ``(BH, CHUNK, 4)`` (one 16-byte row per block and step; blocks first,
   see README.md) and ``b``; with one thread per block the time axis lies in each thread's
   registers, so
   ``tl.associative_scan`` over it (combine ``(P, e) then (Q, f) = (Q P, Q e + f)`` on the six
   scalars of a block) runs inside the thread: from a zero state ``h_t = P_t x + e_t``, ``x`` the
   state entering the chunk, and the chunk's map ``(P, e)`` is the last row;
3. publish ``(P, e)`` with flag 1 (chunk 0 knows its end state at once and skips it), look back
   over the predecessors ``W`` at a time (flag 2 = inclusive end state: stop; 1 = aggregate:
   compose; 0 = spin), publish the end state ``P x + e`` with flag 2, then store ``h``.

``lookback2_bwd.py`` is the backward on the same scheme (default with few pairs).

Buffers per call: ``status`` int32 ``(ntile + 1,)`` zeroed (flags, then the tile counter),
``vals`` fp32 ``(ntile, 8, BH)``: rows ``P11 P12 P21 P22 e1 e2`` (aggregate), ``x1 x2`` (inclusive end
state), never read before their flag says so. Memory ordering as in ``lookback.py``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, max_seq_len
from .fwd import _seq_bounds
from .lookback import _next_tile, _window_flags

__all__ = ["bd2_lookback_forward", "bd2_lookback_cfg", "bd2_lookback_use"]


@triton.jit
def _affine2_combine(p11, p12, p21, p22, e1, e2, q11, q12, q21, q22, f1, f2):
    """(P, e) (earlier) then (Q, f) (later): (Q P, Q e + f)."""
    return (q11 * p11 + q12 * p21, q11 * p12 + q12 * p22,
            q21 * p11 + q22 * p21, q21 * p12 + q22 * p22,
            q11 * e1 + q12 * e2 + f1, q21 * e1 + q22 * e2 + f2)


@triton.jit
def _last(x, R: tl.constexpr):
    """Column ``R - 1`` of a ``(BH, R)`` tensor (exact: adds zeros)."""
    r = tl.arange(0, R)
    return tl.sum(tl.where((r == R - 1)[None, :], x, 0.0), axis=1)


@triton.jit
def _look_back2(Status, Vals, base, c, bh, VS, VC, BH: tl.constexpr, W: tl.constexpr):
    """State entering chunk ``c`` from the chunks ``0..c-1`` of one (sequence, block group), as
    ``lookback._look_back`` with 2 x 2 maps: a window of ``W`` chunks, oldest first, is usable once
    no chunk newer than its newest flag-2 chunk is still 0; flag-2 chunks are the constant map
    ``(0, x)``, older rows the identity; the window's composition is taken on the right of the
    accumulated map ``x_c = Acc x + acc``."""
    w = tl.arange(0, W)
    q11 = tl.full([BH], 1.0, tl.float32)
    q12 = tl.zeros([BH], dtype=tl.float32)
    q21 = tl.zeros([BH], dtype=tl.float32)
    q22 = tl.full([BH], 1.0, tl.float32)
    f1 = tl.zeros([BH], dtype=tl.float32)
    f2 = tl.zeros([BH], dtype=tl.float32)
    hi = c
    done = c * 0
    while done == 0:
        j, ok, r2, rz = _window_flags(Status, base, hi, w, W)
        if (rz < r2) | (rz < 0):  # else spin: re-read the window
            # (BH, W), as the tiles; VS, VC are runtime strides, so the loads are never vectors
            # along the blocks (that gives these tensors, and so the tiles, another layout)
            row = ((base + j) * BH)[None, :] * 8 + (bh * VS)[:, None]
            agg = ((w > r2) & ok)[None, :]
            inc = ((w == r2) & ok)[None, :]
            g11 = tl.load(Vals + row, mask=agg, other=1.0, volatile=True)
            g12 = tl.load(Vals + row + 1 * VC, mask=agg, other=0.0, volatile=True)
            g21 = tl.load(Vals + row + 2 * VC, mask=agg, other=0.0, volatile=True)
            g22 = tl.load(Vals + row + 3 * VC, mask=agg, other=1.0, volatile=True)
            g1 = tl.load(Vals + row + 4 * VC, mask=agg, other=0.0, volatile=True)
            g2 = tl.load(Vals + row + 5 * VC, mask=agg, other=0.0, volatile=True)
            g1 = tl.where(inc, tl.load(Vals + row + 6 * VC, mask=inc, other=0.0, volatile=True), g1)
            g2 = tl.where(inc, tl.load(Vals + row + 7 * VC, mask=inc, other=0.0, volatile=True), g2)
            g11 = tl.where(inc, 0.0, g11)  # the inclusive chunk: the constant map (0, x)
            g22 = tl.where(inc, 0.0, g22)
            s11, s12, s21, s22, s1, s2 = tl.associative_scan(
                (g11, g12, g21, g22, g1, g2), 1, _affine2_combine)
            p11, p12, p21, p22 = _last(s11, W), _last(s12, W), _last(s21, W), _last(s22, W)
            e1, e2 = _last(s1, W), _last(s2, W)
            f1, f2 = q11 * e1 + q12 * e2 + f1, q21 * e1 + q22 * e2 + f2
            q11, q12, q21, q22 = (q11 * p11 + q12 * p21, q11 * p12 + q12 * p22,
                                  q21 * p11 + q22 * p21, q21 * p12 + q22 * p22)
            hi = hi - W
            if r2 >= 0:
                done = done + 1
    return f1, f2


@triton.jit
def _publish_map(Status, me, vrow, VC, p11, p12, p21, p22, e1, e2):
    """A chunk's map ``x -> P x + e`` (rows 0-5 of its values), CTA barrier, flag 1 (release)."""
    tl.store(vrow, p11)
    tl.store(vrow + 1 * VC, p12)
    tl.store(vrow + 2 * VC, p21)
    tl.store(vrow + 3 * VC, p22)
    tl.store(vrow + 4 * VC, e1)
    tl.store(vrow + 5 * VC, e2)
    tl.debug_barrier()
    tl.atomic_xchg(Status + me, 1, sem="release", scope="gpu")


@triton.jit
def _publish_state(Status, me, vrow, VC, y1, y2):
    """A chunk's inclusive end state (rows 6-7), CTA barrier, flag 2 (release)."""
    tl.store(vrow + 6 * VC, y1)
    tl.store(vrow + 7 * VC, y2)
    tl.debug_barrier()
    tl.atomic_xchg(Status + me, 2, sem="release", scope="gpu")


@triton.jit(do_not_specialize=["T", "NC", "NSEQ", "VS", "VC"])
def _bd2_lookback_fwd(A, Bv, Hout, Init, Final, Status, Vals, CU, T, H, NC, NSEQ, VS, VC,
                      CHUNK: tl.constexpr, BH: tl.constexpr, W: tl.constexpr,
                      HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr,
                      PUBLISH_INCL: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t`` with ``A (rows, H, 2, 2)``, ``b``/``h (rows, H, 2)`` (rows =
    ``B*T``; ``B == 1`` with ``CU``), ``Init``/``Final (nseq, H, 2)``. ``PUBLISH_INCL = False``
    (tests only) publishes inclusive states at chunk 0 only, so every look-back walks to it."""
    GH = tl.cdiv(H, BH)
    c, s, pg, ntile = _next_tile(Status, NSEQ, GH, NC)  # chunk-major dynamic tile id (lookback.py)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    bh = tl.arange(0, BH)
    hb = pg * BH + bh
    mh = hb < H
    t = t0 + tl.arange(0, CHUNK)
    # tiles are (BH, CHUNK): blocks first, so that Triton puts the threads on the blocks and the
    # chunk's time axis in each thread's registers (with time first it spread time over lanes)
    ok = mh[:, None] & (t < t1)[None, :]  # chunks never cross eos: rows past it are identity
    k4 = tl.arange(0, 4)
    k2 = tl.arange(0, 2)
    a = tl.load(A + (t[None, :, None] * H + hb[:, None, None]) * 4 + k4[None, None, :],
                mask=ok[:, :, None], other=0.0).to(tl.float32)
    offs_b = (t[None, :, None] * H + hb[:, None, None]) * 2 + k2[None, None, :]
    b1, b2 = tl.split(tl.load(Bv + offs_b, mask=ok[:, :, None], other=0.0).to(tl.float32))
    col0, col1 = tl.split(tl.reshape(a, (BH, CHUNK, 2, 2)))  # A[.., i, j] = a[.., 2 i + j]
    a11, a21 = tl.split(col0)
    a12, a22 = tl.split(col1)
    a11 = tl.where(ok, a11, 1.0)  # past the end: the identity
    a22 = tl.where(ok, a22, 1.0)
    p11, p12, p21, p22, e1, e2 = tl.associative_scan((a11, a12, a21, a22, b1, b2), 1, _affine2_combine)
    base = (s.to(tl.int64) * GH + pg) * NC
    me = base + c
    vrow = Vals + me * BH * 8 + bh * VS
    x1 = tl.zeros([BH], dtype=tl.float32)
    x2 = tl.zeros([BH], dtype=tl.float32)
    if c == 0:
        if HAS_INIT:
            x1 = tl.load(Init + (s.to(tl.int64) * H + hb) * 2, mask=mh, other=0.0).to(tl.float32)
            x2 = tl.load(Init + (s.to(tl.int64) * H + hb) * 2 + 1, mask=mh, other=0.0).to(tl.float32)
    elif t0 < eos:
        _publish_map(Status, me, vrow, VC, _last(p11, CHUNK), _last(p12, CHUNK), _last(p21, CHUNK),
                     _last(p22, CHUNK), _last(e1, CHUNK), _last(e2, CHUNK))
        x1, x2 = _look_back2(Status, Vals, base, c, bh, VS, VC, BH, W)
    if (t0 < eos) | (c == 0):  # empty chunks past a sequence's end (varlen) do nothing more
        h1 = p11 * x1[:, None] + p12 * x2[:, None] + e1
        h2 = p21 * x1[:, None] + p22 * x2[:, None] + e2
        y1 = _last(h1, CHUNK)
        y2 = _last(h2, CHUNK)
        if PUBLISH_INCL or c == 0:  # before h: the release fence then waits for few stores
            _publish_state(Status, me, vrow, VC, y1, y2)
        tl.store(Hout + offs_b, tl.join(h1, h2).to(Hout.dtype.element_ty), mask=ok[:, :, None])
        if STORE_FINAL:
            if t1 == eos:  # the sequence's last chunk (chunk 0 of an empty sequence: h0)
                fo = Final + (s.to(tl.int64) * H + hb) * 2
                tl.store(fo, y1, mask=mh)
                tl.store(fo + 1, y2, mask=mh)


def bd2_lookback_use(tune: dict, chunk, few: bool, grad: bool) -> bool:
    """Whether an ``m = 2`` forward is this look-back pass (``plan.bd_plan``).
    ``TUNE["bd2_lookback"]``: ``"auto"`` (default) where the default forward would time-chunk
    (``chunk`` set; forwards without gradients only, since the chunked backward needs the chunk
    products) or would run one pass with ``few`` programs (fewer than SMs: the ring kernel is
    bound by its programs there, README.md); ``True`` also elsewhere (one-pass backwards only);
    ``False`` never; ``"auto"`` not with ``TUNE['chunk']`` or ``TUNE['variant']`` set. H100, fp32,
    CUDA graphs, ring / chunked forward against this (RESULTS.md, eighteenth session): B8 T2048
    N768 0.1086 / 0.0847 ms, B4 T4096 N768 0.1350 / 0.0926, B2 T8192 N768 0.1359 / 0.0950, B1
    T16384 N768 0.1359 / 0.1007; with 192 ring programs (more than the H100's 132 SMs) the ring
    stays: B16 T1024 N768 0.0811 / 0.0827, B8 T2048 N1536 0.1571 / 0.1595, N4096 0.3527 / 0.4013."""
    mode = tune.get("bd2_lookback", "auto")
    if mode not in (False, True, "auto"):
        raise ValueError(f"TUNE['bd2_lookback'] must be 'auto', False or True, got {mode!r}")
    if grad and chunk is not None:
        return False
    # a forced chunk length or forward kernel (TUNE 'chunk', 'variant') asks for those: tests
    forced = "chunk" in tune or "variant" in tune
    return mode is True or (mode == "auto" and not forced and (chunk is not None or few))


def bd2_lookback_cfg(tune: dict, ngroups: int):
    """(CHUNK, BH, W, num_warps) from ``TUNE`` keys ``lb2_chunk``, ``lb2_window`` and ``lb2_bh``
    (32: one warp per 32 blocks, so that each thread owns one block and the chunk's time axis).
    Defaults: 16-step chunks and windows of 4 from 16 (sequence, block group) pairs on, else 32
    and 2. H100, fp32, CUDA graphs, ms (RESULTS.md, eighteenth session, one run):

    ============================  =========  =========  =========  =========
    shape (pairs)                 16 x w4    16 x w2    32 x w2    32 x w4
    ============================  =========  =========  =========  =========
    B8 T2048 N768 (96)            0.0838     0.0847     0.0909     0.0984
    B4 T4096 N768 (48)            0.0866     0.0892     0.0927     0.0996
    B2 T8192 N768 (24)            0.0922     0.0969     0.0950     0.1005
    B1 T16384 N768 (12)           0.1037     0.1124     0.1004     0.1053
    ============================  =========  =========  =========  =========

    64-step chunks spill (255 registers; 0.237 ms at B8)."""
    many = ngroups >= 16
    return tile_cfg(tune, "lb2", 16 if many else 32, 4 if many else 2)


def tile_cfg(tune: dict, prefix: str, chunk: int, window: int):
    """``(CHUNK, BH, W, num_warps)`` of an in-thread look-back (``lookback2.py``,
    ``lookback4.py``): ``TUNE`` keys ``<prefix>_chunk``, ``_window`` (defaults ``chunk``,
    ``window``) and ``_bh`` (32: one warp per 32 blocks, each thread one block), powers of two."""
    ch = tune.get(f"{prefix}_chunk", chunk)
    bh = tune.get(f"{prefix}_bh", 32)
    w = tune.get(f"{prefix}_window", window)
    for k, v in ((f"{prefix}_chunk", ch), (f"{prefix}_bh", bh), (f"{prefix}_window", w)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"TUNE[{k!r}] must be a power of two, got {v}")
    if bh < 32:  # fewer blocks than threads: Triton would spread the time axis over the lanes
        raise ValueError(f"TUNE['{prefix}_bh'] must be at least 32, got {bh}")
    return ch, bh, w, bh // 32


def bd2_lookback_forward(A, b, h0, cu, tune, empty, max_len=None):
    """One launch. ``A (B, T, H, 2, 2)``, ``b (B, T, H, 2)``, ``h0 (nseq, H, 2)`` or None, ``cu``
    int64 offsets or None; ``empty`` allocates outputs (the launcher's NaN-poisoning ``_empty``).
    Returns ``(h, h_final, None)`` (``scan._bd_forward``'s contract: no chunk products)."""
    B, T, H, m = b.shape
    if m != 2:
        raise ValueError(f"bd2_lookback_forward needs 2 x 2 blocks, got m = {m}")
    nseq = B if cu is None else cu.numel() - 1
    ch, bh, w, nw = bd2_lookback_cfg(tune, nseq * cdiv(H, tune.get("lb2_bh", 32)))
    dev = b.device
    max_len = max_seq_len(T, cu, max_len)
    nc = max(1, cdiv(max_len, ch))  # >= 1: chunk 0 writes h_final = h0 of empty sequences
    ntile = nseq * cdiv(H, bh) * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)  # 0 = nothing published
    # per tile 8 rows of BH values: the block stride VS = 1 and row stride VC = BH. The other
    # order, (BH, 8) per tile (VS = 8, VC = 1), made B8 T2048 N768 0.1047 ms against 0.0849
    # (16-step chunks, H100, eighteenth session): 8 sectors per warp load instead of 4
    vs, vc = 1, bh
    vals = empty((ntile, 8, bh), torch.float32, dev)
    h = empty(b.shape, b.dtype, dev)
    final = empty((nseq, H, 2), torch.float32, dev)
    if ntile:
        _bd2_lookback_fwd[(ntile,)](
            A, b, h, h0 if h0 is not None else b, final, status, vals, cu if cu is not None else b,
            T, H, nc, nseq, vs, vc, CHUNK=ch, BH=bh, W=w, HAS_INIT=h0 is not None, STORE_FINAL=True,
            VARLEN=cu is not None, PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)),
            num_warps=nw)
    return h, final, None
