"""Single-pass decoupled look-back backward for 2 x 2 blocks: the default ``m = 2`` backward where
there are fewer (sequence, 32-block group) pairs than 1.5 times the SMs (``bd2_bwd_lookback_use``).

The adjoint of ``h_t = A_t h_{t-1} + b_t`` runs backwards in time:
``lam_t = dh_t + A_{t+1}^T lam_{t+1}`` (``dh_final`` joins at a sequence's last step), then
``db_t = lam_t``, ``dA_t = lam_t h_{t-1}^T`` (``h_{bos-1} = h0``), ``dh0 = A_bos^T lam_bos``. As
``lookback_bwd.py`` does for ``m = 1``: tiles on *reversed* chunk indices ``cr = ncs - 1 - c``
(``cr = 0``, a sequence's last chunk, starts from ``dh_final`` and publishes its carry at once;
a tile waits only on tiles of smaller ``cr``, handed out before it), and the carry between chunks is
``mu = A_{t0}^T lam_{t0}``, which chunk ``c - 1`` adds to its last step. Inside a tile, rows in
reverse time (row ``r`` is time ``t1 - 1 - r``) carry the coefficient ``A_{t+1}^T`` (the identity
on row 0, whose carry already holds it), so one in-thread ``tl.associative_scan`` of the 2 x 2
affine maps (``lookback2.py``) gives ``lam = C_r mu_in + v_r``, and the chunk's map is
``mu_out = A_{t0}^T (C mu_in + v)`` (last row). The look-back and the published values are the
forward's (``_look_back2``, ``_publish_map``, ``_publish_state``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, max_seq_len
from .lookback2 import (_affine2_combine, _last, _look_back2, _publish_map, _publish_state,
                        bd2_lookback_cfg)
from .lookback import _next_tile
from .lookback_bwd import _reversed_chunk

__all__ = ["bd2_lookback_backward", "bd2_bwd_lookback_use"]


@triton.jit
def _split4(x, R: tl.constexpr, C: tl.constexpr):
    """``(R, C, 4)`` rows of 2 x 2 blocks (row-major) -> ``A00, A01, A10, A11`` as ``(R, C)``."""
    col0, col1 = tl.split(tl.reshape(x, (R, C, 2, 2)))
    a00, a10 = tl.split(col0)
    a01, a11 = tl.split(col1)
    return a00, a01, a10, a11


@triton.jit(do_not_specialize=["T", "NC", "NSEQ", "VS", "VC"])
def _bd2_lookback_bwd(A, Hs, H0, G, DHT, DA, DB, DH0, Status, Vals, CU, T, H, NC, NSEQ, VS, VC,
                      CHUNK: tl.constexpr, BH: tl.constexpr, W: tl.constexpr, HAS_H0: tl.constexpr,
                      HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, PUBLISH_INCL: tl.constexpr):
    """``A``/``DA (rows, H, 2, 2)``, ``h``/``dh``/``db (rows, H, 2)`` (rows = ``B*T``; ``B == 1``
    with ``CU``), ``H0``/``DHT``/``DH0 (nseq, H, 2)``; ``Status`` int32 ``(ntile + 1,)`` zeroed;
    ``Vals`` fp32 ``(ntile, 8, BH)``. ``PUBLISH_INCL = False`` (tests only): carries published by
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
    k2 = tl.arange(0, 2)
    offs_a = (t[None, :, None] * H + hb[:, None, None]) * 4 + k4[None, None, :]
    offs_s = (t[None, :, None] * H + hb[:, None, None]) * 2 + k2[None, None, :]
    okn = ok & (r > 0)[None, :]  # row 0's coefficient A_{t1} is in the carry
    n00, n01, n10, n11 = _split4(tl.load(A + offs_a + 4 * H, mask=okn[:, :, None], other=0.0).to(tl.float32),
                                 BH, CHUNK)
    g1, g2 = tl.split(tl.load(G + offs_s, mask=ok[:, :, None], other=0.0).to(tl.float32))
    # coefficient A_{t+1}^T, the identity where not loaded
    c11, c12, c21, c22, v1, v2 = tl.associative_scan(
        (tl.where(okn, n00, 1.0), n10, n01, tl.where(okn, n11, 1.0), g1, g2), 1, _affine2_combine)
    real = mh & ((c + 0 * bh) >= 0)
    o00, o01, o10, o11 = _split4(tl.load(A + ((t0 * H + hb) * 4)[:, None, None] + k4[None, None, :],
                                         mask=real[:, None, None], other=0.0).to(tl.float32), BH, 1)
    a00 = tl.where(real, tl.sum(o00, axis=1), 1.0)  # A_{t0}; the identity for an empty sequence
    a01 = tl.sum(o01, axis=1)
    a10 = tl.sum(o10, axis=1)
    a11 = tl.where(real, tl.sum(o11, axis=1), 1.0)
    q11, q12, q21, q22 = _last(c11, CHUNK), _last(c12, CHUNK), _last(c21, CHUNK), _last(c22, CHUNK)
    w1, w2 = _last(v1, CHUNK), _last(v2, CHUNK)
    p11, p12 = a00 * q11 + a10 * q21, a00 * q12 + a10 * q22  # A_{t0}^T (C, v)
    p21, p22 = a01 * q11 + a11 * q21, a01 * q12 + a11 * q22
    e1, e2 = a00 * w1 + a10 * w2, a01 * w1 + a11 * w2
    base = (s.to(tl.int64) * GH + pg) * NC
    me = base + cr
    vrow = Vals + me * BH * 8 + bh * VS
    so = (s.to(tl.int64) * H + hb) * 2
    x1 = tl.zeros([BH], dtype=tl.float32)
    x2 = tl.zeros([BH], dtype=tl.float32)
    if cr == 0:  # a sequence's last chunk: its carry is dh_final
        if HAS_DHT:
            x1 = tl.load(DHT + so, mask=mh, other=0.0).to(tl.float32)
            x2 = tl.load(DHT + so + 1, mask=mh, other=0.0).to(tl.float32)
    elif c >= 0:
        _publish_map(Status, me, vrow, VC, p11, p12, p21, p22, e1, e2)
        x1, x2 = _look_back2(Status, Vals, base, cr, bh, VS, VC, BH, W)
    if (c >= 0) | (cr == 0):  # tiles past a shorter sequence's chunks (varlen) do nothing
        y1 = p11 * x1 + p12 * x2 + e1
        y2 = p21 * x1 + p22 * x2 + e2
        if c >= 0:
            if PUBLISH_INCL or cr == 0:  # before the tile's stores (the release fence waits)
                _publish_state(Status, me, vrow, VC, y1, y2)
        l1 = c11 * x1[:, None] + c12 * x2[:, None] + v1
        l2 = c21 * x1[:, None] + c22 * x2[:, None] + v2
        tl.store(DB + offs_s, tl.join(l1, l2).to(DB.dtype.element_ty), mask=ok[:, :, None])
        hp1, hp2 = tl.split(tl.load(Hs + offs_s - 2 * H, mask=(ok & (t > bos)[None, :])[:, :, None],
                                    other=0.0).to(tl.float32))
        if HAS_H0:
            first = (t == bos)[None, :]
            hp1 = tl.where(first, tl.load(H0 + so, mask=mh, other=0.0).to(tl.float32)[:, None], hp1)
            hp2 = tl.where(first, tl.load(H0 + so + 1, mask=mh, other=0.0).to(tl.float32)[:, None], hp2)
        da = tl.join(tl.join(l1 * hp1, l2 * hp1), tl.join(l1 * hp2, l2 * hp2))  # [i, j] = lam_i h_j
        tl.store(DA + offs_a, tl.reshape(da, (BH, CHUNK, 4)).to(DA.dtype.element_ty), mask=ok[:, :, None])
        if c <= 0:  # chunk 0, or the one tile of an empty sequence
            tl.store(DH0 + so, y1, mask=mh)
            tl.store(DH0 + so + 1, y2, mask=mh)


def bd2_bwd_lookback_use(tune: dict, m: int, grad: bool, pairs: int, nsm: int) -> bool:
    """Whether an ``m = 2`` scan with gradients takes this backward (and the look-back forward,
    ``lookback2.py``: the one-pass backward needs only ``h``). ``pairs``: (sequence, 32-block
    group) pairs; ``nsm``: the device's SMs. ``TUNE["bd2_bwd_lookback"]``: ``"auto"`` (default)
    where ``pairs < 1.5 nsm`` (198 on an H100), and not with ``TUNE`` keys ``chunk``, ``variant``
    or ``bwd_variant`` set or ``bd2_lookback = False`` (those ask for the ring / chunked passes);
    ``True`` always; ``False`` never. H100, fp32, CUDA graphs, fwd+bwd medians of 3 rounds, ms,
    the ring or chunked backward against this one (RESULTS.md, nineteenth session, two runs):

    ==========================  =================  =================
    shape (pairs)               ring / chunked     look-back
    ==========================  =================  =================
    B8 T2048 N768 (96)          0.2854, 0.2840     0.2201, 0.2193
    B4 T4096 N768 (48)          0.3259             0.2248
    B1 T16384 N768 (12)         0.3261, 0.3255     0.2460, 0.2459
    B16 T1024 N768 (192)        0.2205, 0.2199     0.2189, 0.2188
    B8 T2048 N1536 (192)        0.4332             0.4244
    B8 T2048 N2048 (256)        0.5154             0.5585
    B4 T2048 N4096 (256)        0.5115             0.5497
    B8 T2048 N3072 (384)        0.7566             0.8289
    B8 T2048 N4096 (512)        1.0141, 1.0111     1.1002, 1.0960
    ==========================  =================  ================="""
    mode = tune.get("bd2_bwd_lookback", "auto")
    if mode not in (False, True, "auto"):
        raise ValueError(f"TUNE['bd2_bwd_lookback'] must be 'auto', False or True, got {mode!r}")
    if m != 2 or not grad:
        return False
    if mode == "auto":
        forced = any(k in tune for k in ("chunk", "variant", "bwd_variant")) or tune.get("bd2_lookback") is False
        return not forced and 2 * pairs < 3 * nsm
    return mode


def bd2_lookback_backward(A, h, h0, g, dhT, cu, tune, empty, max_len=None):
    """``(dA, db, dh0)`` in one launch. ``A (B, T, H, 2, 2)``, ``h``/``g`` (the cotangent of
    ``h``) ``(B, T, H, 2)``, ``h0``/``dhT`` ``(nseq, H, 2)`` or None, ``cu`` int64 offsets or
    None; chunks and windows as ``bd2_lookback_cfg`` with 16 or more pairs; ``dh0`` fp32."""
    B, T, H, m = h.shape
    if m != 2:
        raise ValueError(f"bd2_lookback_backward needs 2 x 2 blocks, got m = {m}")
    nseq = B if cu is None else cu.numel() - 1
    # the forward's 16-step configuration whatever the pairs: with 32-step chunks ptxas (sm_90a)
    # spills 848 bytes a thread here (255 registers), with 16 none (254)
    ch, bh, w, nw = bd2_lookback_cfg(tune, max(16, nseq * cdiv(H, tune.get("lb2_bh", 32))))
    dev = h.device
    max_len = max_seq_len(T, cu, max_len)
    nc = max(1, cdiv(max_len, ch))  # >= 1: an empty sequence's one tile writes dh0 = dh_final
    ntile = nseq * cdiv(H, bh) * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)  # 0 = nothing published
    vals = empty((ntile, 8, bh), torch.float32, dev)
    dA = empty(A.shape, A.dtype, dev)
    db = empty(h.shape, h.dtype, dev)
    dh0 = empty((nseq, H, 2), torch.float32, dev)
    if ntile:
        _bd2_lookback_bwd[(ntile,)](
            A, h, h0 if h0 is not None else h, g, dhT if dhT is not None else h, dA, db, dh0,
            status, vals, cu if cu is not None else h, T, H, nc, nseq, 1, bh, CHUNK=ch, BH=bh, W=w,
            HAS_H0=h0 is not None, HAS_DHT=dhT is not None, VARLEN=cu is not None,
            PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)), num_warps=nw)
    return dA, db, dh0
