"""The ``m = 1`` (diagonal) backward on ``(B, T, N)`` with its tiles loaded by TMA: ``tma.py``'s
forward in reverse time, one pass, one program a channel tile.

Why: with few programs (B8 T2048 N768) the forward loads by TMA (``tma.py``) and the backward was
the decoupled look-back (``lookback_bwd.py``), 74 % of copy on its bytes on an H200 against the
TMA forward's 86 % (RESULTS.md, fifty-first session). TMA copies land in shared memory without
holding registers, which is what let one warp a program keep enough bytes in flight forwards.

The adjoint of ``h_t = a_t h_{t-1} + b_t`` (``math.md`` section 4): ``mu_t = g_t + a_{t+1}
mu_{t+1}`` with ``mu_{eos-1} = g_{eos-1} + dh_final``, ``db_t = mu_t``, ``da_t = mu_t h_{t-1}``
(``h_{bos-1} = h0``, zero without it), ``dh0 = a_{bos} mu_{bos}``. A program walks its sequence's
``(BT, BN)`` tiles from the last to the first. Per tile the descriptors load ``a`` one row ahead
(rows ``ts + 1 ..``: ``a_{t+1}``), ``g`` on the tile's rows and ``h`` one row behind (rows ``ts - 1
..``: ``h_{t-1}``; TMA fills zeros before row 0, and the row before ``bos`` is replaced by
``h0``). The tile's maps ``mu -> a_{t+1} mu + g_t`` are composed from each row to the tile's end
by one ``tl.associative_scan``: on the time-reversed tile (``FLIP``, as ``tma_blocks_bwd.py``
does, cheaper than Triton's ``reverse=True`` there) or with ``reverse=True``. Rows at or past
``eos`` are identity steps with ``g = 0``, and so is the transition out of the sequence's last
row, where ``dh_final`` enters. The tile's whole map, reduced off the serial chain, carries ``mu``
to the tile before (one FMA a tile on the chain, as in the forward). ``da`` and ``db`` go out by
TMA stores without ``cu_seqlens`` (``TSTORE``) or by masked int64-offset stores; ``dh0`` from
``a_{bos}`` (a plain load) once the walk is done (``dh_final`` for an empty sequence).

Requirements (``diag_tma_bwd_usable``): ``tma.tma_tensors_ok`` for ``a``, ``h`` and ``g`` (TMA's
alignment rules; compute capability 9+ or the interpreter) and tiles of at least 16 bytes of each.
Where it runs: ``diag_tma_bwd_config`` (``scan.TUNE["diag_tma_bwd"]``, "auto" by default: measured
bands of programs per SM on an H200, ``_AUTO_BY_DEVICE``), read by ``plan.diag_plan``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._host import band_choice, cdiv, device_name, row_by_name
from .fwd import _affine_combine
from .tma import _AUTO_ROW_ALIGN, TensorDescriptor, tma_program, tma_tensors_ok, tma_tile_store

__all__ = ["DiagBwdTiles", "diag_tma_backward", "diag_tma_bwd_config", "diag_tma_bwd_usable"]


@triton.jit(do_not_specialize=["T"])
def _diag_bwd_tma_kernel(DA, DG, DH, Aa, H0, DHT, dA, dB, dH0, SA, SB, CU, T, N,
                         BT: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr,
                         HAS_H0: tl.constexpr, HAS_DHT: tl.constexpr, VARLEN: tl.constexpr,
                         TSTORE: tl.constexpr, FLIP: tl.constexpr):
    """``DA``, ``DG``, ``DH``: descriptors over ``a``, ``g = dL/dh`` and ``h`` (``(B, T, N)``, or
    ``(1, T_total, N)`` with ``CU``), boxes ``(1, BT, BN)``; ``Aa`` the plain ``a`` (``dh0``);
    ``H0``, ``DHT``, ``dH0`` ``(nseq, N)`` (``dH0`` fp32); ``dA``, ``dB`` plain outputs and ``SA``,
    ``SB`` their descriptors (``TSTORE``)."""
    s, bos, eos, sd, n0, n, mn = tma_program(CU, T, N, BN, VARLEN)
    so = s.to(tl.int64) * N + n
    r = tl.arange(0, BT)
    # the row of the composed (flipped) scan that holds the tile's whole map: row 0's suffix
    whole = (r == (BT - 1 if FLIP else 0))[:, None]
    if HAS_DHT:
        x = tl.load(DHT + so, mask=mn, other=0.0).to(tl.float32)  # mu entering the last tile
    else:
        x = tl.zeros([BN], dtype=tl.float32)
    if HAS_H0:
        p = tl.load(H0 + so, mask=mn, other=0.0).to(tl.float32)
    else:
        p = tl.zeros([BN], dtype=tl.float32)
    row0 = sd.to(tl.int64) * T
    nt = tl.cdiv(eos - bos, BT)
    for i in tl.range(0, nt, num_stages=NS):
        ts = bos + (nt - 1 - i) * BT
        t = ts + r
        ok = (t < eos)[:, None]
        cv = tl.where((t + 1 < eos)[:, None], DA.load([sd, ts + 1, n0]).reshape(BT, BN).to(tl.float32), 1.0)
        gv = tl.where(ok, DG.load([sd, ts, n0]).reshape(BT, BN).to(tl.float32), 0.0)
        if FLIP:
            ca, cb = tl.associative_scan((tl.flip(cv, 0), tl.flip(gv, 0)), 0, _affine_combine)
        else:
            ca, cb = tl.associative_scan((cv, gv), 0, _affine_combine, reverse=True)
        P = tl.sum(tl.where(whole, ca, 0.0), axis=0)  # off the chain: x -> P x + E
        E = tl.sum(tl.where(whole, cb, 0.0), axis=0)
        mu = ca * x[None, :] + cb
        if FLIP:
            mu = tl.flip(mu, 0)
        hp = DH.load([sd, ts - 1, n0]).reshape(BT, BN).to(tl.float32)
        hp = tl.where((t == bos)[:, None], p[None, :], hp)  # h_{bos-1} = h0
        tma_tile_store(dB, SB, mu, row0, sd, ts, t, ok, n, mn, N, n0, TSTORE)
        tma_tile_store(dA, SA, mu * hp, row0, sd, ts, t, ok, n, mn, N, n0, TSTORE)
        x = P * x + E
    nonempty = mn & (tl.zeros([BN], dtype=tl.int32) + (eos - bos) > 0)
    a0 = tl.load(Aa + (row0 + bos) * N + n, mask=nonempty, other=1.0).to(tl.float32)  # empty: dh_final
    tl.store(dH0 + so, a0 * x, mask=mn)


# "auto" takes this backward on the GPUs named here (a substring of the name), for rows of a
# multiple of 64 bytes (``tma._AUTO_ROW_ALIGN``, as the forward's rule) of fixed-length batches
# (no ``cu_seqlens``: its masked stores lost, B8 T2048 N768 fp32 0.1779 ms against 0.1100 with
# TMA stores) of at least ``_AUTO_MIN_T`` steps: ``{GPU: {element size of b:
# (((lo, hi), (BT, BN, num_warps, num_stages)), ...)}}``, the band holding ``nseq * cdiv(N, 16) /
# SMs`` programs an SM. H200 fwd+bwd, CUDA graphs, medians of 3 rounds, ms, default (the look-back
# backward below about 4 programs an SM, the tile backward above) -> 64-step / 32-step tiles
# (RESULTS.md, fifty-fifth session). fp32 T2048 N768: B6 (2.18 an SM) 0.0979 -> 0.1008 (lost),
# B7 (2.55) 0.1089 -> 0.1028 / 0.1126, B8 (2.91) 0.1222 -> 0.1100 / 0.1201, B9 (3.27) 0.1366 ->
# 0.1275 / 0.1317, B10 (3.64) 0.1500 -> 0.1405 / 0.1391, B12 (4.36) 0.1937 -> 0.1632 (32 x 16,
# one call; 32 channels: 0.1721 / 0.1690 against 0.1944 in another), B14 (5.09) 0.2161 -> 0.2116 / 0.1943; B8 T4096 N768 (2.91) 0.2373
# -> 0.2159 / 0.2377; B16 T1024 N768 (5.82) 0.1237 -> 0.1126 (32 x 16; 32 channels: 0.1136 /
# 0.1090, another call); B8 T2048 N1536 (5.82) 0.2375 -> 0.2473 / 0.2223; at 7.27
# (B20 T1024) 0.1578 -> 0.1523 / 0.1560, past it lost (B24 T1024 8.73, B8 N2048 7.76, B32 T512
# 11.6, B8 N4096 15.5: 0.5164 -> 0.6036). bf16, 64-step tiles: B6 0.0964 -> 0.1168, B8 0.1139 ->
# 0.1168 (lost), B12 0.1717 -> 0.1613, B16 T1024 0.0932 -> 0.0875.
_AUTO_BY_DEVICE = {"H200": {4: (((2.5, 4.0), (64, 16, 1, 3)), ((4.0, 7.0), (32, 16, 1, 3))),
                            2: (((4.0, 7.0), (64, 16, 1, 3)),)}}
_AUTO_MIN_T = 1024


def _auto_tiles(b, nseq: int, max_len: int, varlen: bool, sms: int):
    """The ``_AUTO_BY_DEVICE`` tiles ``(BT, BN, num_warps, num_stages)`` for ``b`` ``(B, T, N)``
    (a CUDA tensor), or None."""
    if not b.is_cuda or varlen or max_len < _AUTO_MIN_T or b.shape[2] * b.element_size() % _AUTO_ROW_ALIGN:
        return None
    rows = (row_by_name(_AUTO_BY_DEVICE, device_name(b.device)) or {}).get(b.element_size(), ())
    return band_choice(rows, nseq * cdiv(b.shape[2], 16) / sms, right_closed=False)


class DiagBwdTiles(NamedTuple):
    """The launch of this backward: tile steps and channels, warps, pipeline stages, whether
    ``da`` / ``db`` go out by TMA stores, and the kernel's ``FLIP``."""
    bt: int
    bn: int
    nw: int
    ns: int
    tstore: bool
    flip: bool


def diag_tma_bwd_config(b, nseq: int, max_len: int, varlen: bool, tune: dict, sms: int):
    """The ``DiagBwdTiles`` of this backward for ``b`` ``(B, T, N)`` (or the forward's ``h``), or
    None where it does not run. ``tune["diag_tma_bwd"]``: "auto" (the default: a band of
    ``_AUTO_BY_DEVICE`` for the GPU and element size, fixed-length batches of ``_AUTO_MIN_T``+
    steps), True (wherever a backward follows; ``diag_tma_bwd_usable`` still decides at launch)
    or False. Tiles: the band's, else 64 steps on one warp, 16 channels up to 4 programs an SM
    (else 32), 3 stages; TMA stores without ``cu_seqlens``, the flipped scan. Keys ``tma_bwd_bt``,
    ``_bn``, ``_nw``, ``_ns``, ``_tstore``, ``_flip`` override."""
    mode = tune.get("diag_tma_bwd", "auto")
    if mode not in (True, False, "auto"):
        raise ValueError(f'TUNE["diag_tma_bwd"] must be "auto", True or False, got {mode!r}')
    auto = _auto_tiles(b, nseq, max_len, varlen, sms) if mode is not False else None
    if mode is False or (mode == "auto" and auto is None):
        return None
    N = b.shape[2]
    bt, bn, nw, ns = auto or (64, 16 if nseq * cdiv(N, 16) <= 4 * sms else 32, 1, 3)
    g = tune.get
    return DiagBwdTiles(g("tma_bwd_bt", bt), g("tma_bwd_bn", bn), g("tma_bwd_nw", nw), g("tma_bwd_ns", ns),
                        bool(g("tma_bwd_tstore", True)) and not varlen, bool(g("tma_bwd_flip", True)))


def diag_tma_bwd_usable(a, h, g, bn: int) -> bool:
    """Whether ``a``, ``h``, ``g`` (``(B, T, N)``) meet TMA's rules (``tma.tma_tensors_ok``) for
    tiles ``bn`` channels wide (at least 16 bytes of each)."""
    return min(x.element_size() for x in (a, h, g)) * bn >= 16 and tma_tensors_ok(a, h, g)


def diag_tma_backward(a, h, h0, g, dhT, cu, tune: dict, sms: int, empty, max_len=None):
    """``(da, db, dh0)`` of the ``m = 1`` scan (``scan._diag_backward``'s contract), or None where
    this backward does not run (``diag_tma_bwd_config``) or TMA refuses the inputs
    (``diag_tma_bwd_usable``; the caller then runs another backward): ``a``, ``h`` (the forward's
    output), ``g = dL/dh`` ``(B, T, N)`` (``B == 1`` with ``cu``), ``h0`` ``(nseq, N)`` or None,
    ``dhT = dL/dh_final`` ``(nseq, N)`` fp32 or None, ``cu`` int64 offsets or None, ``max_len``
    the longest sequence (None: ``T``; the rule reads it for fixed-length batches only); ``empty``
    the scan's allocator (NaN under poisoning).
    ``da`` and ``db`` take ``a``'s and ``h``'s dtypes, ``dh0`` is fp32."""
    B, T, N = h.shape
    nseq = B if cu is None else cu.numel() - 1
    cfg = diag_tma_bwd_config(h, nseq, T if max_len is None else max_len, cu is not None, tune, sms)
    if cfg is None or not diag_tma_bwd_usable(a, h, g, cfg.bn):
        return None

    def desc(x):
        return TensorDescriptor(x, shape=[B, T, N], strides=[T * N, N, 1], block_shape=[1, cfg.bt, cfg.bn])

    dev = h.device
    da = empty(a.shape, a.dtype, dev)
    db = empty(h.shape, h.dtype, dev)
    dh0 = empty((nseq, N), torch.float32, dev)
    _diag_bwd_tma_kernel[(cdiv(N, cfg.bn), nseq)](
        desc(a), desc(g), desc(h), a, h0 if h0 is not None else dh0, dhT if dhT is not None else dh0,
        da, db, dh0, desc(da) if cfg.tstore else dh0, desc(db) if cfg.tstore else dh0,
        cu if cu is not None else dh0, T, N, BT=cfg.bt, BN=cfg.bn, NS=cfg.ns, HAS_H0=h0 is not None,
        HAS_DHT=dhT is not None, VARLEN=cu is not None, TSTORE=cfg.tstore, FLIP=cfg.flip,
        num_warps=cfg.nw)
    return da, db, dh0
