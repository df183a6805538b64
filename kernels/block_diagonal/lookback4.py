"""Single-pass decoupled look-back forward for 4 x 4 blocks: ``lookback2.py``'s scheme at ``m = 4``,
the default ``m = 4`` forward without gradients below two ring programs per SM, unless the ring would
chunk time with fewer programs than a quarter of the SMs (``bd4_lookback_use``).

Why: the ring forward at ``m = 4`` has 8 blocks a program, so B8 T2048 N768 gives 192 programs
that run the whole sequence each, bound by the program rather than DRAM (README.md "Few programs").
Here one program is a tile of ``CHUNK`` steps x ``BH = 32 num_warps`` blocks, each thread one
block with the chunk's time axis in its registers, and chunk carries pass through a status buffer
(``lookback.py``'s flags and ``_next_tile``).

A 4 x 4 affine map is 20 scalars (``P`` row-major, then ``e``), held as a tuple of 20 tensors so
that the helpers below loop over them with ``tl.static_range``; only the scan's combine spells its
40 arguments out. Per tile: load ``A`` (four ``(BH, CHUNK, 4)`` row loads, 16 bytes a thread
each) and ``b``, scan the maps in the thread (``tl.associative_scan``, combine ``(P, e) then
(Q, f) = (Q P, Q e + f)``), so that from a zero state ``h_t = P_t x + e_t`` with ``x`` the state
entering the chunk; chunk 0 knows ``x`` (``h0`` or 0), every other tile publishes its map (the
last row) with flag 1 and looks back ``W`` chunks at a time as ``lookback2._look_back2`` does with
2 x 2 maps; then it publishes its end state with flag 2 and stores ``h``.

The scan's 20 x ``CHUNK`` values stay in registers across the look-back: with 8-step chunks and
windows of 1 ptxas (sm_90a) reports 255 registers and 48 bytes of spills. Reloading ``A`` and
``b`` after the look-back and scanning again with ``A_{t0} x`` added to the first ``b`` needs
fewer registers (212, no spills) but was slower on an H100 everywhere (B8 T2048 N768 0.1832 ms
against 0.1536 with 8-step chunks and windows of 2; B4 T4096 N768 0.2124 against 0.1705;
RESULTS.md, nineteenth session; commit dfbe48a has it as ``TUNE['lb4_keep'] = False``).

Buffers per call: ``status`` int32 ``(ntile + 1,)`` zeroed (flags, then the tile counter),
``vals`` fp32 ``(ntile, 24, BH)``: rows 0-15 ``P``, 16-19 ``e`` (aggregate), 20-23 ``x``
(inclusive end state), never read before their flag says so. Memory ordering as in
``lookback.py``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, max_seq_len
from .fwd import _seq_bounds
from .lookback import _next_tile, _window_flags
from .lookback2 import _last, tile_cfg
from .lookback2_bwd import _split4

__all__ = ["bd4_lookback_forward", "bd4_lookback_cfg", "bd4_lookback_use"]

_ROWS = 24  # value rows per tile: 16 + 4 (map), 4 (inclusive state)


@triton.jit
def _affine4_combine(p00, p01, p02, p03, p10, p11, p12, p13, p20, p21, p22, p23, p30, p31, p32, p33,
                     e0, e1, e2, e3,
                     q00, q01, q02, q03, q10, q11, q12, q13, q20, q21, q22, q23, q30, q31, q32, q33,
                     f0, f1, f2, f3):
    """(P, e) (earlier) then (Q, f) (later): (Q P, Q e + f), 4 x 4 row-major."""
    return _compose4((q00, q01, q02, q03, q10, q11, q12, q13, q20, q21, q22, q23, q30, q31, q32, q33,
                      f0, f1, f2, f3),
                     (p00, p01, p02, p03, p10, p11, p12, p13, p20, p21, p22, p23, p30, p31, p32, p33,
                      e0, e1, e2, e3))


@triton.jit
def _compose4(q, p):
    """The map ``x -> Q (P x + e) + f`` as a 20-tuple, from ``q = (Q, f)`` and ``p = (P, e)``."""
    out = ()
    for i in tl.static_range(4):
        for j in tl.static_range(4):
            out = out + (q[4 * i] * p[j] + q[4 * i + 1] * p[4 + j] + q[4 * i + 2] * p[8 + j]
                         + q[4 * i + 3] * p[12 + j],)
    for i in tl.static_range(4):
        out = out + (q[4 * i] * p[16] + q[4 * i + 1] * p[17] + q[4 * i + 2] * p[18]
                     + q[4 * i + 3] * p[19] + q[16 + i],)
    return out


@triton.jit
def _load_blocks4(A, offs_a, ok):
    """``A``'s 4 x 4 blocks at ``offs_a`` (``(R, C, 4)``: the first row's 4 entries) as a 16-tuple
    of ``(R, C)`` fp32 tensors, row-major, the identity where ``ok`` is false."""
    out = ()
    for i in tl.static_range(4):
        a0, a1, a2, a3 = _split4(tl.load(A + offs_a + 4 * i, mask=ok[:, :, None], other=0.0).to(tl.float32),
                                 ok.shape[0], ok.shape[1])
        out = out + (tl.where(ok, a0, 1.0) if i == 0 else a0, tl.where(ok, a1, 1.0) if i == 1 else a1,
                     tl.where(ok, a2, 1.0) if i == 2 else a2, tl.where(ok, a3, 1.0) if i == 3 else a3)
    return out


@triton.jit
def _load_maps4(A, Bv, offs_a, offs_b, ok):
    """The tile's ``A`` and ``b`` as a 20-tuple of ``(BH, CHUNK)`` fp32 tensors, the identity map
    where ``ok`` is false (past a sequence's end, blocks past ``H``)."""
    b0, b1, b2, b3 = _split4(tl.load(Bv + offs_b, mask=ok[:, :, None], other=0.0).to(tl.float32),
                             ok.shape[0], ok.shape[1])
    return _load_blocks4(A, offs_a, ok) + (b0, b1, b2, b3)


@triton.jit
def _load_state4(X, so, mask):
    """The four entries of per-block states at ``X + so`` (``(BH,)`` offsets), fp32, 0 where
    ``mask`` is false."""
    return (tl.load(X + so, mask=mask, other=0.0).to(tl.float32), tl.load(X + so + 1, mask=mask, other=0.0).to(tl.float32),
            tl.load(X + so + 2, mask=mask, other=0.0).to(tl.float32), tl.load(X + so + 3, mask=mask, other=0.0).to(tl.float32))


@triton.jit
def _lasts(x, K: tl.constexpr, R: tl.constexpr):
    """Column ``R - 1`` of each of the first ``K`` ``(BH, R)`` tensors of tuple ``x``."""
    out = ()
    for k in tl.static_range(K):
        out = out + (_last(x[k], R),)
    return out


@triton.jit
def _publish4(Status, me, vrow, VC, x, first: tl.constexpr, K: tl.constexpr, flag: tl.constexpr):
    """Rows ``first .. first + K - 1`` of a tile's values from tuple ``x``, CTA barrier, then the
    tile's flag (release; ``lookback.py``)."""
    for k in tl.static_range(K):
        tl.store(vrow + (first + k) * VC, x[k])
    tl.debug_barrier()
    tl.atomic_xchg(Status + me, flag, sem="release", scope="gpu")


@triton.jit
def _look_back4(Status, Vals, base, c, bh, VS, VC, BH: tl.constexpr, W: tl.constexpr):
    """State entering chunk ``c`` (a 4-tuple) from chunks ``0..c-1`` of one (sequence, block
    group): ``lookback2._look_back2`` with 4 x 4 maps (flag-2 chunks are the constant map
    ``(0, x)``, rows before the newest flag-2 chunk the identity)."""
    w = tl.arange(0, W)
    acc = ()
    for k in tl.static_range(20):
        acc = acc + (tl.full([BH], 1.0 if (k < 16 and k % 5 == 0) else 0.0, tl.float32),)
    hi = c
    done = c * 0
    while done == 0:
        j, ok, r2, rz = _window_flags(Status, base, hi, w, W)
        if (rz < r2) | (rz < 0):  # else spin: re-read the window
            row = ((base + j) * BH)[None, :] * 24 + (bh * VS)[:, None]  # (BH, W), as lookback2
            agg = ((w > r2) & ok)[None, :]
            inc = ((w == r2) & ok)[None, :]
            g = ()
            for k in tl.static_range(16):  # P: loaded, 0 for the inclusive chunk, else identity
                v = tl.load(Vals + row + k * VC, mask=agg, other=1.0 if k % 5 == 0 else 0.0, volatile=True)
                g = g + (tl.where(inc, 0.0, v),)
            for k in tl.static_range(4):  # e: loaded, x for the inclusive chunk, else 0
                v = tl.load(Vals + row + (16 + k) * VC, mask=agg, other=0.0, volatile=True)
                g = g + (tl.where(inc, tl.load(Vals + row + (20 + k) * VC, mask=inc, other=0.0,
                                               volatile=True), v),)
            win = _lasts(tl.associative_scan(g, 1, _affine4_combine), 20, W)
            acc = _compose4(acc, win)  # the window's map, then what was accumulated
            hi = hi - W
            if r2 >= 0:
                done = done + 1
    return acc[16], acc[17], acc[18], acc[19]


@triton.jit(do_not_specialize=["T", "NC", "NSEQ", "VS", "VC"])
def _bd4_lookback_fwd(A, Bv, Hout, Init, Final, Status, Vals, CU, T, H, NC, NSEQ, VS, VC,
                      CHUNK: tl.constexpr, BH: tl.constexpr, W: tl.constexpr,
                      HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr,
                      PUBLISH_INCL: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t`` with ``A (rows, H, 4, 4)``, ``b``/``h (rows, H, 4)`` (rows =
    ``B*T``; ``B == 1`` with ``CU``), ``Init``/``Final (nseq, H, 4)``. ``PUBLISH_INCL = False``
    (tests only) publishes inclusive states at chunk 0 only, so every look-back walks to it."""
    GH = tl.cdiv(H, BH)
    c, s, pg, ntile = _next_tile(Status, NSEQ, GH, NC)  # chunk-major dynamic tile id (lookback.py)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    bh = tl.arange(0, BH)
    hb = pg * BH + bh
    mh = hb < H
    t = t0 + tl.arange(0, CHUNK)
    ok = mh[:, None] & (t < t1)[None, :]  # (BH, CHUNK), blocks first (lookback2.py says why)
    k4 = tl.arange(0, 4)
    offs_a = (t[None, :, None] * H + hb[:, None, None]) * 16 + k4[None, None, :]
    offs_b = (t[None, :, None] * H + hb[:, None, None]) * 4 + k4[None, None, :]
    base = (s.to(tl.int64) * GH + pg) * NC
    me = base + c
    vrow = Vals + me * BH * 24 + bh * VS
    so = (s.to(tl.int64) * H + hb) * 4
    x0 = tl.zeros([BH], dtype=tl.float32)
    x1 = tl.zeros([BH], dtype=tl.float32)
    x2 = tl.zeros([BH], dtype=tl.float32)
    x3 = tl.zeros([BH], dtype=tl.float32)
    # from a zero state h_t = P_t x + e_t: the scan's rows stay live across the look-back
    sc = tl.associative_scan(_load_maps4(A, Bv, offs_a, offs_b, ok), 1, _affine4_combine)
    if c == 0:
        if HAS_INIT:
            x0, x1, x2, x3 = _load_state4(Init, so, mh)
    elif t0 < eos:
        _publish4(Status, me, vrow, VC, _lasts(sc, 20, CHUNK), 0, 20, 1)
        x0, x1, x2, x3 = _look_back4(Status, Vals, base, c, bh, VS, VC, BH, W)
    if (t0 < eos) | (c == 0):  # empty chunks past a sequence's end (varlen) do nothing more
        hs = ()
        for i in tl.static_range(4):
            hs = hs + (sc[4 * i] * x0[:, None] + sc[4 * i + 1] * x1[:, None] + sc[4 * i + 2] * x2[:, None]
                       + sc[4 * i + 3] * x3[:, None] + sc[16 + i],)
        h0, h1, h2, h3 = hs
        last = _lasts((h0, h1, h2, h3), 4, CHUNK)
        if PUBLISH_INCL or c == 0:  # before h: the release fence then waits for few stores
            _publish4(Status, me, vrow, VC, last, 20, 4, 2)
        hv = tl.reshape(tl.join(tl.join(h0, h2), tl.join(h1, h3)), (BH, CHUNK, 4))  # [.., k] = h_k
        tl.store(Hout + offs_b, hv.to(Hout.dtype.element_ty), mask=ok[:, :, None])
        if STORE_FINAL:
            if t1 == eos:  # the sequence's last chunk (chunk 0 of an empty sequence: h0)
                for k in tl.static_range(4):
                    tl.store(Final + so + k, last[k], mask=mh)


def bd4_lookback_use(tune: dict, m: int, grad: bool, chunk, programs: int, nsm: int) -> bool:
    """Whether an ``m = 4`` forward is this look-back pass (``plan.bd_plan``). ``programs``: the
    ring forward's programs (8 blocks each); ``nsm``: the device's SMs. ``TUNE["bd4_lookback"]``:
    ``"auto"`` (default) for forwards without gradients with fewer ring programs than twice the SMs,
    and not with ``TUNE`` keys ``chunk`` or ``variant`` set, except where the ring would cut time
    into chunks (``chunk``: its chunk length, or None) with fewer programs than a quarter of the SMs
    (``TUNE["lb4_min_programs"]``); ``True`` always (with gradients the backward then runs one
    pass: slower where the default chunks it); ``False`` never.
    H100, fp32, CUDA graphs, medians of 3 rounds, ms, the default forward (ring, chunked below one
    program per SM) against this one (RESULTS.md, nineteenth session):

    ===========================  ==========  ==========
    shape (ring programs)        default     look-back
    ===========================  ==========  ==========
    B1 T16384 N768 (24)          0.2308      0.2306
    B2 T8192 N768 (48)           0.2299      0.1832
    B4 T4096 N768 (96)           0.2289      0.1573
    B1 T32768 N1536 (48)         0.8590      0.6796
    B8 T2048 N768 (192)          0.1481      0.1426
    B16 T1024 N768 (384)         0.1090      0.1350
    B8 T2048 N1536 (384)         0.2127      0.2563
    ===========================  ==========  ==========

    H200, the same way (5 rounds, thirty-first session), chunked ring against this one: B1 N768
    T8192 / T16384 / T32768 (24 programs) 0.0991 / 0.1884 / 0.3734 against 0.1185 / 0.2215 /
    0.4268, B1 N384 T16384 / T32768 (12) 0.1018 / 0.1936 against 0.1545 / 0.2897; B1 T16384 N1536
    and B2 T16384 N768 (48) 0.3693 / 0.3716 against 0.3302 / 0.3303. The look-back's chain of
    carries (one per 8-step chunk) is as long with few blocks as with many, while the ring's time
    follows the bytes; so below a quarter of the SMs the chunked ring runs (the H100's 24-program
    row above is a tie)."""
    mode = tune.get("bd4_lookback", "auto")
    if mode not in (False, True, "auto"):
        raise ValueError(f"TUNE['bd4_lookback'] must be 'auto', False or True, got {mode!r}")
    if m != 4:
        return False
    if mode == "auto":
        forced = "chunk" in tune or "variant" in tune
        ring_chunks = chunk is not None and programs < tune.get("lb4_min_programs", nsm // 4)
        return not grad and not forced and programs < 2 * nsm and not ring_chunks
    return mode


def bd4_lookback_cfg(tune: dict):
    """(CHUNK, BH, W, num_warps) from ``TUNE`` keys ``lb4_chunk`` (8), ``lb4_window`` (1) and
    ``lb4_bh`` (32: one warp per 32 blocks, each thread one block). H100 (RESULTS.md, nineteenth
    session), ms at B8 T2048 N768 / B4 T4096 / B1 T16384: 8 x 1 0.1426 / 0.1573 / 0.2294, 8 x 2
    0.1536 / 0.1705 / 0.2559, 8 x 4 0.1776 at B4, 4 x 1 0.1940 / - / 0.3863; 16-step chunks spill
    1 KB (255 registers)."""
    return tile_cfg(tune, "lb4", 8, 1)


def bd4_lookback_forward(A, b, h0, cu, tune, empty, max_len=None):
    """One launch. ``A (B, T, H, 4, 4)``, ``b (B, T, H, 4)``, ``h0 (nseq, H, 4)`` or None, ``cu``
    int64 offsets or None; ``empty`` allocates outputs (the launcher's NaN-poisoning ``_empty``).
    Returns ``(h, h_final, None)`` (``scan._bd_forward``'s contract: no chunk products)."""
    B, T, H, m = b.shape
    if m != 4:
        raise ValueError(f"bd4_lookback_forward needs 4 x 4 blocks, got m = {m}")
    nseq = B if cu is None else cu.numel() - 1
    ch, bh, w, nw = bd4_lookback_cfg(tune)
    dev = b.device
    max_len = max_seq_len(T, cu, max_len)
    nc = max(1, cdiv(max_len, ch))  # >= 1: chunk 0 writes h_final = h0 of empty sequences
    ntile = nseq * cdiv(H, bh) * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)  # 0 = nothing published
    vals = empty((ntile, _ROWS, bh), torch.float32, dev)  # row stride BH, block stride 1 (lookback2)
    h = empty(b.shape, b.dtype, dev)
    final = empty((nseq, H, 4), torch.float32, dev)
    if ntile:
        _bd4_lookback_fwd[(ntile,)](
            A, b, h, h0 if h0 is not None else b, final, status, vals, cu if cu is not None else b,
            T, H, nc, nseq, 1, bh, CHUNK=ch, BH=bh, W=w, HAS_INIT=h0 is not None, STORE_FINAL=True,
            VARLEN=cu is not None, PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)),
            num_warps=nw)
    return h, final, None
