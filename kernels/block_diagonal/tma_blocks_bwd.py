"""The ``m = 2`` and ``m = 4`` backward (adjoint scan) with tiles loaded by TMA: ``tma_blocks.py``'s
scheme in reverse time.

With ``mu_t = dL/dh_t`` in full (direct gradient ``g_t`` plus what flows back):
``mu_t = A_{t+1}^T mu_{t+1} + g_t`` with ``mu_{eos} = dh_final`` entering through the identity,
``dA_t = mu_t h_{t-1}^T``, ``db_t = mu_t``, ``dh0 = A_{bos}^T mu_{bos}`` (``math.md`` section 4).
A program walks its sequence's ``(BT, BH)`` tiles from the last to the first. Per tile the
descriptors load ``A`` one row ahead (rows ``ts + 1 ..``: the transition ``A_{t+1}``, transposed
by picking entries), ``g`` and ``h`` one row behind (rows ``ts - 1 ..``: ``h_{t-1}``; TMA fills
zeros before row 0, and the row before ``bos`` is replaced by ``h0``). A suffix
``tl.associative_scan`` composes the maps ``mu -> A_{t+1}^T mu + g_t`` from each row to the
tile's end, so ``mu_t = C_t x + e_t`` with ``x = mu`` entering from the right. By default it is
a forward scan of the time-reversed tile (``FLIP``, ``_flip_all``: cheaper than Triton's
``reverse=True``), and the tile before starts from ``mu`` of the tile's first row (``CARRY_MU``;
otherwise the tile's map, reduced off the chain). Rows at or past ``eos`` and the transition out
of the sequence's last row are identity steps. ``dA`` and ``db`` are stored by TMA, or with masked
int64 offsets under varlen; ``dh0`` from ``A_{bos}`` (plain loads) once the walk is done
(``dh_final`` for an empty sequence).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._host import cdiv, device_name, num_sms
from .lookback2 import _affine2_combine
from .lookback4 import _affine4_combine
from .tma import TensorDescriptor, tma_seq, tma_tensors_ok, tma_tile_store
from .tma_blocks import _apply4, _frame, _pick_rows, _split2, _split4, _state, bd_tma_config

__all__ = ["BwdTiles", "bd_tma_backward", "bd_tma_bwd_config", "bd_tma_bwd_usable", "bd_tma_bwd_use"]


@triton.jit
def _join4(x0, x1, x2, x3):
    """``(..., 4)`` with entry ``k`` from ``x_k`` (entries may carry trailing axes)."""
    return tl.join(tl.join(x0, x2), tl.join(x1, x3))


@triton.jit
def _flip_all(xs):
    """Each ``(BT, BH)`` tensor of the tuple ``xs`` reversed along time (axis 0).

    The kernels' ``FLIP``: the suffix scan as a forward scan of the time-reversed tile (row
    ``BT - 1 - t`` of its result is row ``t``'s map; the whole tile's map is the last row), and
    ``mu`` reversed back. Why: Triton 3.6's sm_90a code for ``reverse=True`` reverses every
    scanned value across lanes before and after the scan (butterfly shuffles); reversing the
    inputs once and ``mu``'s ``m`` values is cheaper (RESULTS.md, twenty-sixth session)."""
    out = ()
    for k in tl.static_range(len(xs)):
        out = out + (tl.flip(xs[k], 0),)
    return out


@triton.jit(do_not_specialize=["T"])
def _bd2_bwd_tma_kernel(DA, DH, DG, A, H0, DHT, dA, dB, dH0, SA, SB, CU, T, H, BT: tl.constexpr,
                        BH: tl.constexpr, NS: tl.constexpr, HAS_H0: tl.constexpr,
                        HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, TSTORE: tl.constexpr,
                        FLIP: tl.constexpr, CARRY_MU: tl.constexpr):
    """``m = 2``: descriptors ``DA`` over ``A`` ``(rows, 4 H)``, ``DH`` over ``h``, ``DG`` over ``g``
    ``(rows, 2 H)``; ``A`` plain (``dh0``); ``H0``, ``DHT``, ``dH0`` ``(nseq, H, 2)`` fp32.
    ``FLIP``: see ``_flip_all``; ``CARRY_MU``: the tile before takes ``mu`` of the tile's first
    row (a pick of ``m`` values) instead of the tile's map applied to ``x`` (a pick of
    ``m^2 + m``, off the chain)."""
    s = tl.program_id(1)
    bos, eos, sd = tma_seq(CU, s, T, VARLEN)
    k0, kb, mk, c, mc, last = _frame(H, BT, BH, 2)
    r = tl.arange(0, BT)
    first = (r == 0)[:, None]
    so = s.to(tl.int64) * 2 * H + 2 * kb
    x1, x2 = _state(DHT, so, mk, HAS_DHT, 2)  # mu entering the last tile: dh_final
    p1, p2 = _state(H0, so, mk, HAS_H0, 2)
    row0 = sd.to(tl.int64) * T
    ca = 4 * k0 + tl.arange(0, 4 * BH)  # the tile's columns of dA
    n = tl.cdiv(eos - bos, BT)
    for i in tl.range(0, n, num_stages=NS):
        ts = bos + (n - 1 - i) * BT
        t = ts + r
        ok = (t < eos)[:, None]
        step = (t + 1 < eos)[:, None]  # A_{t+1} belongs to the sequence
        col0, col1 = tl.split(DA.load([sd, ts + 1, 4 * k0]).reshape(BT, BH, 2, 2))
        a11, a21 = _split2(col0, BT, BH)
        a12, a22 = _split2(col1, BT, BH)
        g1, g2 = _split2(DG.load([sd, ts, 2 * k0]).reshape(BT, BH, 2), BT, BH)
        steps = (tl.where(step, a11, 1.0), tl.where(step, a21, 0.0),  # A^T
                 tl.where(step, a12, 0.0), tl.where(step, a22, 1.0), tl.where(ok, g1, 0.0), tl.where(ok, g2, 0.0))
        if FLIP:
            sc = tl.associative_scan(_flip_all(steps), 0, _affine2_combine)
        else:
            sc = tl.associative_scan(steps, 0, _affine2_combine, reverse=True)
        mu1 = sc[0] * x1[None, :] + sc[1] * x2[None, :] + sc[4]
        mu2 = sc[2] * x1[None, :] + sc[3] * x2[None, :] + sc[5]
        if FLIP:
            mu1, mu2 = _flip_all((mu1, mu2))
        q1, q2 = _split2(DH.load([sd, ts - 1, 2 * k0]).reshape(BT, BH, 2), BT, BH)
        at_bos = (t == bos)[:, None]
        q1 = tl.where(at_bos, p1[None, :], q1)  # h_{bos-1} = h0
        q2 = tl.where(at_bos, p2[None, :], q2)
        da = tl.join(tl.join(mu1 * q1, mu2 * q1), tl.join(mu1 * q2, mu2 * q2)).reshape(BT, 4 * BH)
        tma_tile_store(dB, SB, tl.join(mu1, mu2).reshape(BT, 2 * BH), row0, sd, ts, t, ok, c, mc, 2 * H,
                       2 * k0, TSTORE)
        tma_tile_store(dA, SA, da, row0, sd, ts, t, ok, ca, ca < 4 * H, 4 * H, 4 * k0, TSTORE)
        if CARRY_MU:
            x1, x2 = _pick_rows((mu1, mu2), first, 2)
        else:
            p = _pick_rows(sc, last if FLIP else first, 6)  # the tile's map
            x1, x2 = p[0] * x1 + p[1] * x2 + p[4], p[2] * x1 + p[3] * x2 + p[5]
    ab = A + ((row0 + bos) * H + kb) * 4
    nonempty = mk & (tl.zeros([BH], dtype=tl.int32) + (eos - bos) > 0)  # a (BH,) mask
    b11 = tl.load(ab, mask=nonempty, other=1.0).to(tl.float32)  # empty: dh0 = dh_final
    b12 = tl.load(ab + 1, mask=nonempty, other=0.0).to(tl.float32)
    b21 = tl.load(ab + 2, mask=nonempty, other=0.0).to(tl.float32)
    b22 = tl.load(ab + 3, mask=nonempty, other=1.0).to(tl.float32)
    tl.store(dH0 + so, b11 * x1 + b21 * x2, mask=mk)
    tl.store(dH0 + so + 1, b12 * x1 + b22 * x2, mask=mk)


@triton.jit
def _blocks4_t(x, ok, BT: tl.constexpr, BH: tl.constexpr):
    """A loaded ``A`` tile as the transposed blocks' 16 entries (row-major of ``A^T``), fp32,
    the identity where ``ok`` is false."""
    ce, co = tl.split(x.reshape(BT, BH, 4, 2, 2))
    c0, c2 = tl.split(ce)
    c1, c3 = tl.split(co)
    cols = (_split4(c0, BT, BH), _split4(c1, BT, BH), _split4(c2, BT, BH), _split4(c3, BT, BH))
    out = ()
    for i in tl.static_range(4):
        for j in tl.static_range(4):  # (A^T)[i][j] = A[j][i] = column i's entry j
            out = out + (tl.where(ok, cols[i][j], 1.0 if i == j else 0.0),)
    return out


@triton.jit(do_not_specialize=["T"])
def _bd4_bwd_tma_kernel(DA, DH, DG, A, H0, DHT, dA, dB, dH0, SA, SB, CU, T, H, BT: tl.constexpr,
                        BH: tl.constexpr, NS: tl.constexpr, HAS_H0: tl.constexpr,
                        HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, TSTORE: tl.constexpr,
                        FLIP: tl.constexpr, CARRY_MU: tl.constexpr):
    """``m = 4``: as ``_bd2_bwd_tma_kernel`` with ``A`` ``(rows, 16 H)`` and 20-tuple maps."""
    s = tl.program_id(1)
    bos, eos, sd = tma_seq(CU, s, T, VARLEN)
    k0, kb, mk, c, mc, last = _frame(H, BT, BH, 4)
    r = tl.arange(0, BT)
    first = (r == 0)[:, None]
    so = s.to(tl.int64) * 4 * H + 4 * kb
    x0, x1, x2, x3 = _state(DHT, so, mk, HAS_DHT, 4)
    p0, p1, p2, p3 = _state(H0, so, mk, HAS_H0, 4)
    row0 = sd.to(tl.int64) * T
    ca = 16 * k0 + tl.arange(0, 16 * BH)
    n = tl.cdiv(eos - bos, BT)
    for i in tl.range(0, n, num_stages=NS):
        ts = bos + (n - 1 - i) * BT
        t = ts + r
        ok = (t < eos)[:, None]
        g0, g1, g2, g3 = _split4(DG.load([sd, ts, 4 * k0]).reshape(BT, BH, 4), BT, BH)
        steps = _blocks4_t(DA.load([sd, ts + 1, 16 * k0]), (t + 1 < eos)[:, None], BT, BH) + (
            tl.where(ok, g0, 0.0), tl.where(ok, g1, 0.0), tl.where(ok, g2, 0.0), tl.where(ok, g3, 0.0))
        if FLIP:
            sc = tl.associative_scan(_flip_all(steps), 0, _affine4_combine)
        else:
            sc = tl.associative_scan(steps, 0, _affine4_combine, reverse=True)
        mu = _apply4(sc, x0[None, :], x1[None, :], x2[None, :], x3[None, :])
        if FLIP:
            mu = _flip_all(mu)
        q = _split4(DH.load([sd, ts - 1, 4 * k0]).reshape(BT, BH, 4), BT, BH)
        at_bos = (t == bos)[:, None]
        q = (tl.where(at_bos, p0[None, :], q[0]), tl.where(at_bos, p1[None, :], q[1]),
             tl.where(at_bos, p2[None, :], q[2]), tl.where(at_bos, p3[None, :], q[3]))  # h0
        # dA[i][j] = mu_i q_j, row-major: the outer join (the fastest axis of the result) runs over j
        cols = ()
        for j in tl.static_range(4):
            cols = cols + (_join4(mu[0] * q[j], mu[1] * q[j], mu[2] * q[j], mu[3] * q[j]),)
        da = _join4(cols[0], cols[1], cols[2], cols[3]).reshape(BT, 16 * BH)
        tma_tile_store(dB, SB, _join4(mu[0], mu[1], mu[2], mu[3]).reshape(BT, 4 * BH), row0, sd, ts, t, ok,
                       c, mc, 4 * H, 4 * k0, TSTORE)
        tma_tile_store(dA, SA, da, row0, sd, ts, t, ok, ca, ca < 16 * H, 16 * H, 16 * k0, TSTORE)
        if CARRY_MU:
            x0, x1, x2, x3 = _pick_rows(mu, first, 4)
        else:
            x0, x1, x2, x3 = _apply4(_pick_rows(sc, last if FLIP else first, 20), x0, x1, x2, x3)
    ab = A + ((row0 + bos) * H + kb) * 16
    nonempty = mk & (tl.zeros([BH], dtype=tl.int32) + (eos - bos) > 0)  # a (BH,) mask
    xs = (x0, x1, x2, x3)
    for j in tl.static_range(4):  # dh0_j = sum_i A_bos[i][j] x_i (identity when empty)
        acc = tl.zeros([BH], dtype=tl.float32)
        for k in tl.static_range(4):
            a = tl.load(ab + 4 * k + j, mask=nonempty, other=1.0 if k == j else 0.0).to(tl.float32)
            acc += a * xs[k]
        tl.store(dH0 + so + j, acc, mask=mk)


_KERNELS = {2: _bd2_bwd_tma_kernel, 4: _bd4_bwd_tma_kernel}


def bd_tma_bwd_use(tune: dict, m: int) -> bool:
    """Whether a scan whose forward runs by TMA (``bd_tma_config``) takes this backward too
    (``plan.bd_plan``). ``tune["bd<m>_tma_bwd"]``: "auto" (default: at ``m = 4``), True or
    False (the look-back or one-pass backward, reading the TMA forward's ``h``).

    H100, fp32, CUDA graphs, medians of 3 rounds, forward+backward as % of a copy of its bytes,
    this backward (``bd_tma_bwd_config``'s tiles, TMA stores) against the other after the TMA
    forward (RESULTS.md, twenty-fifth session), T2048 N768: ``m = 4`` B5 56 against 54, B6 50 / 47,
    B8 59 / 53, B10 60 / 60, B11 65 / 62, B4 T4096 49 / 48; twenty-sixth session, with ``FLIP`` and
    ``CARRY_MU`` (``bd_tma_bwd_config``), this backward gains 2-9 points more (B8 63-64). At
    ``m = 2`` it loses: B8 62 (32-step tiles) / 63, B16 T1024 61 / 64; twenty-fourth session: B10
    63 / 64, B8 N1536 60 / 66; with ``FLIP`` and ``CARRY_MU`` B8 56 / 63, B16 T1024 61 / 64, B10
    65 / 64 (twenty-sixth)."""
    mode = tune.get(f"bd{m}_tma_bwd", "auto")
    if mode not in (True, False, "auto"):
        raise ValueError(f'TUNE["bd{m}_tma_bwd"] must be "auto", True or False, got {mode!r}')
    return mode is True or (mode == "auto" and m == 4)


class BwdTiles(NamedTuple):
    """The launch of this backward: tile steps and blocks, warps, pipeline stages, whether ``dA``
    / ``db`` go out by TMA stores, and the kernels' ``FLIP`` / ``CARRY_MU``."""
    bt: int
    bh: int
    nw: int
    ns: int
    tstore: bool
    flip: bool
    carry_mu: bool


def bd_tma_bwd_config(m: int, H: int, nseq: int, fwd_cfg, tune: dict, sms: int, varlen: bool,
                      device: str = "") -> BwdTiles:
    """The ``BwdTiles`` of this backward. At ``m = 2`` the forward's ``fwd_cfg``
    (``bd_tma_config``); at ``m = 4`` 2-block tiles of 32 steps below 2.4 four-block programs per
    SM (``P`` of ``bd_tma_auto``; 3.1 where ``device``, the GPU's name, names an H200), of 16
    steps from there, one warp, the forward's stages. ``dA``
    and ``db`` go out by TMA stores where there is no varlen (the tile past ``T`` is clipped; with
    varlen rows past ``eos`` belong to the next sequence: masked stores). The scan runs on the
    time-reversed tile (``FLIP``, ``_flip_all``) and the carry is ``mu`` (``CARRY_MU``). Keys
    ``tma<m>_bwd_bt``, ``_bh``, ``_nw``, ``_ns``, ``_tstore``, ``_flip``, ``_carry_mu`` override.

    Why (H100, fp32, fwd+bwd % of a copy of its bytes, RESULTS.md): twenty-fifth session, the
    forward's 4-block tiles at B8 T2048 N768 gave 46-47 %, 2 blocks 59 (1 block 43, 2 warps 48),
    64 steps 43-55, TMA stores 0-2 points above masked ones. Twenty-sixth session, with ``FLIP``
    and ``CARRY_MU`` (sm_90a code of a 32 x 2 tile: 1704 instructions against 2096, shuffles 388
    against 660) and the forward's ``tma4_carry_h``, against the previous default: B4 T4096 56 / 49
    (32 steps), B5 61 / 56, B6 57 / 49, B7 60 / 56 (16 steps), B8 63 / 59, B9 64 / 55, B10 63 /
    61, B11 63 / 64 (the one loss: without ``FLIP`` 64), B12 57 / 55, B13 55 / 53. H200
    (twenty-eighth session), 32 against 16 steps: B5 (P 1.8) 49 / 44 %, B7 (2.5) 49 / 46, B8 (2.9)
    55 / 51-52, B9 (3.3) 53 / 55, B10 (3.6) 54 / 58, B11 (4.0) 60 / 63."""
    bt, bh, nw, ns = fwd_cfg
    if m == 4:
        bh, bt, nw = 2, 32 if nseq * cdiv(H, 4) / sms < (3.1 if "H200" in device else 2.4) else 16, 1
    keys = ("bt", "bh", "nw", "ns")
    bt, bh, nw, ns = (tune.get(f"tma{m}_bwd_{k}", v) for k, v in zip(keys, (bt, bh, nw, ns)))
    return BwdTiles(bt, bh, nw, ns, bool(tune.get(f"tma{m}_bwd_tstore", True)) and not varlen,
                    bool(tune.get(f"tma{m}_bwd_flip", True)), bool(tune.get(f"tma{m}_bwd_carry_mu", True)))


def bd_tma_bwd_usable(A, h, g) -> bool:
    """Whether ``A``, ``h`` and ``g`` meet TMA's rules (``tma.tma_tensors_ok``) for the backward's
    tiles (their widths: ``bd_tma_backward``)."""
    return tma_tensors_ok(A, h, g)


def bd_tma_backward(A, h, h0, g, dhT, cu, tune, empty, max_len=None):
    """``(dA, db, dh0)`` of the ``m = 2`` or ``4`` scan by TMA (the signature of the look-back
    backwards; ``max_len`` unused): ``A`` ``(B, T, H, m, m)``, ``h`` (the forward's output), ``g``
    (``dL/dh``) ``(B, T, H, m)``, ``h0`` and ``dhT`` ``(nseq, H, m)`` or None; tiles from
    ``bd_tma_bwd_config``. Raises where TMA cannot run."""
    B, T, H, m = h.shape
    nseq = B if cu is None else cu.numel() - 1
    fwd_cfg = bd_tma_config(A, h, nseq, {**tune, f"bd{m}_tma": True}, num_sms(h.device))
    if fwd_cfg is None:
        raise ValueError(f"bd_tma_backward: TMA refused these inputs (m = {m})")
    bt, bh, nw, ns, tstore, flip, carry_mu = bd_tma_bwd_config(m, H, nseq, fwd_cfg, tune, num_sms(h.device),
                                                               cu is not None, device_name(h.device))
    if not bd_tma_bwd_usable(A, h, g) or min(x.element_size() for x in (h, g)) * m * bh < 16:
        raise ValueError(f"bd_tma_backward: TMA refused these inputs (m = {m}, {bh} blocks a tile)")

    def desc(x, width):
        return TensorDescriptor(x, shape=[B, T, width * H], strides=[T * width * H, width * H, 1],
                                block_shape=[1, bt, width * bh])

    dev = h.device
    dA = empty(A.shape, A.dtype, dev)
    db = empty(h.shape, h.dtype, dev)
    dh0 = empty((nseq, H, m), torch.float32, dev)
    _KERNELS[m][(cdiv(H, bh), nseq)](
        desc(A, m * m), desc(h, m), desc(g, m), A, h0 if h0 is not None else dh0,
        dhT if dhT is not None else dh0, dA, db, dh0, desc(dA, m * m) if tstore else dh0,
        desc(db, m) if tstore else dh0, cu if cu is not None else dh0, T, H,
        BT=bt, BH=bh, NS=ns, HAS_H0=h0 is not None, HAS_DHT=dhT is not None,
        VARLEN=cu is not None, TSTORE=tstore, FLIP=flip, CARRY_MU=carry_mu, num_warps=nw)
    return dA, db, dh0
