"""Single-pass decoupled look-back backward for 4 x 4 blocks: ``lookback2_bwd.py``'s scheme with
``lookback4.py``'s maps; the default ``m = 4`` backward for one-pass scans with fewer than 1.4 ring
programs per SM (``bd4_bwd_lookback_use``).

The adjoint ``lam_t = dh_t + A_{t+1}^T lam_{t+1}`` (``dh_final`` joins at a sequence's last step)
gives ``db_t = lam_t``, ``dA_t = lam_t h_{t-1}^T`` (``h_{bos-1} = h0``), ``dh0 = A_bos^T lam_bos``.
Tiles run on reversed chunk indices (``lookback_bwd._reversed_chunk``: a sequence's last chunk
starts from ``dh_final``); rows in reverse time carry the coefficient ``A_{t+1}^T`` (the identity
on row 0), scanned in each thread with ``lookback4._affine4_combine``, so ``lam = C_r mu_in + v_r``
and the chunk's map is ``mu_out = A_{t0}^T (C mu_in + v)`` (last row), published and looked up
with ``lookback4``'s ``_publish4`` / ``_look_back4``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, max_seq_len
from .lookback import _next_tile
from .lookback4 import (_affine4_combine, _compose4, _lasts, _load_blocks4, _load_state4, _look_back4,
                        _publish4, _ROWS, bd4_lookback_cfg)
from .lookback2_bwd import _split4
from .lookback_bwd import _reversed_chunk

__all__ = ["bd4_lookback_backward", "bd4_bwd_lookback_use"]


@triton.jit
def _transpose4(a):
    """A row-major 4 x 4 tuple's transpose."""
    out = ()
    for i in tl.static_range(4):
        for j in tl.static_range(4):
            out = out + (a[4 * j + i],)
    return out


@triton.jit(do_not_specialize=["T", "NC", "NSEQ", "VS", "VC"])
def _bd4_lookback_bwd(A, Hs, H0, G, DHT, DA, DB, DH0, Status, Vals, CU, T, H, NC, NSEQ, VS, VC,
                      CHUNK: tl.constexpr, BH: tl.constexpr, W: tl.constexpr, HAS_H0: tl.constexpr,
                      HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, PUBLISH_INCL: tl.constexpr):
    """``A``/``DA (rows, H, 4, 4)``, ``h``/``dh``/``db (rows, H, 4)`` (rows = ``B*T``; ``B == 1``
    with ``CU``), ``H0``/``DHT``/``DH0 (nseq, H, 4)``; ``Status`` int32 ``(ntile + 1,)`` zeroed;
    ``Vals`` fp32 ``(ntile, 24, BH)``. ``PUBLISH_INCL = False`` (tests only): carries published by
    the last chunk only, so every look-back composes maps down to it."""
    GH = tl.cdiv(H, BH)
    cr, s, pg, ntile = _next_tile(Status, NSEQ, GH, NC)  # cr: reversed chunk index (later: smaller)
    bos, eos, c, t0, t1 = _reversed_chunk(CU, s, cr, T, CHUNK, VARLEN)
    bh = tl.arange(0, BH)
    hb = pg * BH + bh
    mh = hb < H
    r = tl.arange(0, CHUNK)
    t = t1 - 1 - r
    ok = mh[:, None] & ((t >= t0) & ((c + 0 * r) >= 0))[None, :]  # (BH, CHUNK), blocks first
    k4 = tl.arange(0, 4)
    offs_a = (t[None, :, None] * H + hb[:, None, None]) * 16 + k4[None, None, :]
    offs_s = (t[None, :, None] * H + hb[:, None, None]) * 4 + k4[None, None, :]
    okn = ok & (r > 0)[None, :]  # row 0's coefficient A_{t1} is in the carry
    g0, g1, g2, g3 = _split4(tl.load(G + offs_s, mask=ok[:, :, None], other=0.0).to(tl.float32), BH, CHUNK)
    # coefficient A_{t+1}^T (the identity where not loaded), then dh_t
    sc = tl.associative_scan(_transpose4(_load_blocks4(A, offs_a + 16 * H, okn)) + (g0, g1, g2, g3), 1,
                             _affine4_combine)
    real = (mh & ((c + 0 * bh) >= 0))[:, None]
    a0t = _transpose4(_load_blocks4(A, ((t0 * H + hb) * 16)[:, None, None] + k4[None, None, :], real))
    a0t = _lasts(a0t, 16, 1)  # A_{t0}^T as (BH,) tensors; the identity for an empty sequence
    zero = tl.zeros([BH], dtype=tl.float32)
    mp = _compose4(a0t + (zero, zero, zero, zero), _lasts(sc, 20, CHUNK))  # A_{t0}^T (C, v)
    base = (s.to(tl.int64) * GH + pg) * NC
    me = base + cr
    vrow = Vals + me * BH * 24 + bh * VS
    so = (s.to(tl.int64) * H + hb) * 4
    x0 = tl.zeros([BH], dtype=tl.float32)
    x1 = tl.zeros([BH], dtype=tl.float32)
    x2 = tl.zeros([BH], dtype=tl.float32)
    x3 = tl.zeros([BH], dtype=tl.float32)
    if cr == 0:  # a sequence's last chunk: its carry is dh_final
        if HAS_DHT:
            x0, x1, x2, x3 = _load_state4(DHT, so, mh)
    elif c >= 0:
        _publish4(Status, me, vrow, VC, mp, 0, 20, 1)
        x0, x1, x2, x3 = _look_back4(Status, Vals, base, cr, bh, VS, VC, BH, W)
    if (c >= 0) | (cr == 0):  # tiles past a shorter sequence's chunks (varlen) do nothing
        y = ()
        for i in tl.static_range(4):
            y = y + (mp[4 * i] * x0 + mp[4 * i + 1] * x1 + mp[4 * i + 2] * x2 + mp[4 * i + 3] * x3 + mp[16 + i],)
        if c >= 0:
            if PUBLISH_INCL or cr == 0:  # before the tile's stores (the release fence waits)
                _publish4(Status, me, vrow, VC, y, 20, 4, 2)
        lam = ()
        for i in tl.static_range(4):
            lam = lam + (sc[4 * i] * x0[:, None] + sc[4 * i + 1] * x1[:, None] + sc[4 * i + 2] * x2[:, None]
                         + sc[4 * i + 3] * x3[:, None] + sc[16 + i],)
        tl.store(DB + offs_s, tl.reshape(tl.join(tl.join(lam[0], lam[2]), tl.join(lam[1], lam[3])),
                                         (BH, CHUNK, 4)).to(DB.dtype.element_ty), mask=ok[:, :, None])
        hp0, hp1, hp2, hp3 = _split4(tl.load(Hs + offs_s - 4 * H, mask=(ok & (t > bos)[None, :])[:, :, None],
                                             other=0.0).to(tl.float32), BH, CHUNK)
        if HAS_H0:
            first = (t == bos)[None, :]
            q0, q1, q2, q3 = _load_state4(H0, so, mh)
            hp0 = tl.where(first, q0[:, None], hp0)
            hp1 = tl.where(first, q1[:, None], hp1)
            hp2 = tl.where(first, q2[:, None], hp2)
            hp3 = tl.where(first, q3[:, None], hp3)
        for i in tl.static_range(4):  # row i of dA: lam_i h_{t-1}^T
            row = tl.join(tl.join(lam[i] * hp0, lam[i] * hp2), tl.join(lam[i] * hp1, lam[i] * hp3))
            tl.store(DA + offs_a + 4 * i, tl.reshape(row, (BH, CHUNK, 4)).to(DA.dtype.element_ty),
                     mask=ok[:, :, None])
        if c <= 0:  # chunk 0, or the one tile of an empty sequence
            for k in tl.static_range(4):
                tl.store(DH0 + so + k, y[k], mask=mh)


def bd4_bwd_lookback_use(tune: dict, m: int, grad: bool, chunk, programs: int, nsm: int) -> bool:
    """Whether an ``m = 4`` scan with gradients takes this backward (and ``lookback4.py``'s
    forward). ``chunk``: the gradient rule's chunk length (None: one pass); ``programs``: the ring
    kernels' programs; ``nsm``: the device's SMs. ``TUNE["bd4_bwd_lookback"]``: ``"auto"``
    (default) for one-pass scans with fewer than ``TUNE["bd4_bwd_lb_below"]`` (1.4) ring programs
    per SM, not with ``TUNE`` keys ``chunk``, ``variant`` or ``bwd_variant`` set or
    ``bd4_lookback = False``; ``True`` always; ``False`` never.

    Why a line in programs: with few programs the ring passes are bound by their chain of
    dependent steps (about 0.18 us a step forward and backward, whatever the batch: B3, B4 and B5
    at T4096 N768 all took 0.74 ms), the look-back by bytes (47-49 % of a copy of the floor's
    bytes), so the look-back wins until the ring's programs carry enough bytes. H100, fp32, CUDA
    graphs, fwd+bwd medians of 3 rounds, ms, ring passes / this (RESULTS.md, nineteenth and
    twentieth sessions), by ring programs: B3 T4096 N768 (72) 0.7363 / 0.3492; B4 T4096 N768 (96)
    0.7404 / 0.4403; B5 T4096 N768 (120) 0.7454 / 0.5308; B6 T4096 N768 (144) 0.7904 / 0.6259;
    B5 T4096 N1024 (160) 0.7983 / 0.6908; B8 T2048 N640 (160) 0.4074 / 0.3587; B7 T2048 N768
    (168) 0.4091 / 0.3737; B11 T2048 N512 (176) 0.4111 / 0.3888; then B8 T2048 N768 (192)
    0.4182 / 0.4204, B6 T2048 N1024 (192) 0.4166 / 0.4200, B4 T1024 N1536 (192) 0.2128 /
    0.2236, B16 T1024 N768 (384) 0.3118 / 0.4081, B8 T2048 N4096 (2048) 1.6242 / 2.0454; chunked
    (not taken): B1 T16384 N768 0.5409 / 0.5809, B1 T65536 N768 2.0674 / 2.1871."""
    mode = tune.get("bd4_bwd_lookback", "auto")
    if mode not in (False, True, "auto"):
        raise ValueError(f"TUNE['bd4_bwd_lookback'] must be 'auto', False or True, got {mode!r}")
    if m != 4 or not grad:
        return False
    if mode == "auto":
        forced = any(k in tune for k in ("chunk", "variant", "bwd_variant")) or tune.get("bd4_lookback") is False
        return not forced and chunk is None and programs < tune.get("bd4_bwd_lb_below", 1.4) * nsm
    return mode


def bd4_lookback_backward(A, h, h0, g, dhT, cu, tune, empty, max_len=None):
    """``(dA, db, dh0)`` in one launch. ``A (B, T, H, 4, 4)``, ``h``/``g`` (the cotangent of
    ``h``) ``(B, T, H, 4)``, ``h0``/``dhT`` ``(nseq, H, 4)`` or None, ``cu`` int64 offsets or
    None; chunks and windows as ``bd4_lookback_cfg``; ``dh0`` fp32."""
    B, T, H, m = h.shape
    if m != 4:
        raise ValueError(f"bd4_lookback_backward needs 4 x 4 blocks, got m = {m}")
    nseq = B if cu is None else cu.numel() - 1
    ch, bh, w, nw = bd4_lookback_cfg(tune)
    dev = h.device
    max_len = max_seq_len(T, cu, max_len)
    nc = max(1, cdiv(max_len, ch))  # >= 1: an empty sequence's one tile writes dh0 = dh_final
    ntile = nseq * cdiv(H, bh) * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)  # 0 = nothing published
    vals = empty((ntile, _ROWS, bh), torch.float32, dev)
    dA = empty(A.shape, A.dtype, dev)
    db = empty(h.shape, h.dtype, dev)
    dh0 = empty((nseq, H, 4), torch.float32, dev)
    if ntile:
        _bd4_lookback_bwd[(ntile,)](
            A, h, h0 if h0 is not None else h, g, dhT if dhT is not None else h, dA, db, dh0,
            status, vals, cu if cu is not None else h, T, H, nc, nseq, 1, bh, CHUNK=ch, BH=bh, W=w,
            HAS_H0=h0 is not None, HAS_DHT=dhT is not None, VARLEN=cu is not None,
            PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)), num_warps=nw)
    return dA, db, dh0
