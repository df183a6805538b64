"""Launchers and autograd Functions for ``block_diagonal_scan`` and ``diagonal_scan``.

Dispatch: m = 1 goes to the tile kernels of the diagonal scan; m = 2..32 to the sequential
block kernels (default forward ``_bd_fwd_ring``, 16 steps in flight). When
``num_seqs x programs-per-sequence`` cannot fill the GPU (``_choose_chunk``), time is split into
chunks: (1) per chunk the product of its transitions and its local end state, (2) a short scan of
the chunk carries (the same forward kernel, with chunks as time steps), (3) each chunk re-run
from its carry. The backward does the same with transposed products (``P^T``, saved by the
forward). Single-pass look-backs replace the chunked forward where measured faster: ``m = 1``
(``lookback.py``), ``m = 2`` and ``4`` (``lookback2.py``, ``lookback4.py``; also one-pass forwards
with few programs) and ``m >= 16`` (``lookback_dot.py``); with gradients the backward for ``m = 1``
(``lookback_bwd.py``) and ``m = 2, 4`` with few programs (``lookback2_bwd.py``, ``lookback4_bwd.py``).
The one-pass ``m = 1`` forward with few programs loads its tiles by TMA on Hopper (``tma.py``),
and so do ``m = 2, 4`` in measured bands of programs per SM (``tma_blocks.py``; the backward
by TMA, ``tma_blocks_bwd.py``, at ``m = 4`` after the TMA forward).
"""
from __future__ import annotations

import contextlib
import os

import torch
from .._host import (cdiv, device_band, device_name, diag_vec, max_seq_len, next_pow2, num_sms,
                     row_by_name, row_divisor)
from .bwd import _bd_bwd_gather, _bd_bwd_kernel, _bd_bwd_kernel_g4, _bd_bwd_ring, _diag_bwd_kernel
from .fwd import _bd_fwd_kernel, _bd_fwd_kernel_g4, _bd_fwd_ring, _diag_fwd_kernel
from .lookback2 import bd2_lookback_forward
from .lookback2_bwd import bd2_lookback_backward
from .lookback4 import bd4_lookback_forward
from .lookback4_bwd import bd4_lookback_backward
from .lookback_dot import bd_lookback_forward
from . import tma, tma_blocks, tma_blocks_bwd, tma_bwd
from .shuffles import bwd_gather, ring_gather
from .summary import default_chunk, launch_summary, rerun_factor
from .checks import _check_common, _check_float, _check_time_dim  # noqa: F401  (compile.py's too)
from .time_major import TimeMajorScanFn

__all__ = ["block_diagonal_scan", "diagonal_scan"]

MAX_M = 32
_BWD_FEW = 1024  # below this many programs the backward takes its few-programs kernels
# Test/benchmark knobs (not public API): ``chunk`` forces a chunk length (0 = never chunk),
# ``bh``/``num_warps``/``num_stages``/``bt``/``bn`` override the kernel configuration.
TUNE: dict = {}


@contextlib.contextmanager
def tuned(overrides: dict):
    """``with tuned({"bh": 16}): ...``: ``TUNE`` with these overrides inside the block and exactly
    as before after it, also when the block raises (benchmark sweeps)."""
    saved = dict(TUNE)
    TUNE.update(overrides)
    try:
        yield
    finally:
        TUNE.clear()
        TUNE.update(saved)


def _poison() -> bool:
    return os.environ.get("LRNN_SCAN_POISON", "0") not in ("", "0")


def _empty(shape, dtype, device):
    if _poison():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _num_sms(device) -> int:
    return num_sms(device, cpu=4)  # cached: get_device_properties costs microseconds per call


def _chunk_min_len(grad) -> int:
    """Shortest sequence that time chunking (or an m = 1 look-back in its place) is worth:
    ``TUNE['chunk_min_len']``, else 1024 steps with gradients and 4096 without."""
    return TUNE.get("chunk_min_len", 1024 if grad else 4096)


def _choose_chunk(nprog, max_len, device, align, m=1, grad=False):
    """Chunk length, or None for one pass over the whole sequence.

    Forward only (``grad=False``): chunk below one program per SM, into ``summary.default_chunk``
    steps (256; 128 / 64 with the thread summaries). H200, fp32: 256 within 4 % of the best of {256,
    ..., 2048} at B1 T16384 N768 m = 1..8 (dot / ring summaries); at 192-384 programs (B8 N768,
    m = 4, 8) one ring pass beat every chunking by 1.1-2.3x (chunks read inputs twice). With
    gradients the backward reuses the forward's chunks: chunk only below half a program per SM
    (one at m = 5..16; ``chunk_grad_below``), then aim at 4 programs per SM (128 / 256-step chunks).
    H200, fp32, fwd+bwd at 96 ring programs (thirty-first session): one pass against 256-step
    chunks m = 8 B1 T16384 N1536 3.671 / 1.690 ms, B2 T2048 N768 0.465 / 0.289; m = 16 5.761 /
    2.846, 0.728 / 0.430; but m = 32 B4 T2048 N768 1.168 / 1.593 (RESULTS.md); H100: MEASURED.md,
    "Chunk rules". ``TUNE``: ``chunk`` (forced length, 0 = never), ``chunk_target`` / ``chunk_grad_below``
    (programs per SM), ``chunk_len``, ``chunk_len_grad``, ``chunk_max_m`` (no chunks from this m)."""
    if "chunk" in TUNE:
        c = TUNE["chunk"]
        return None if not c or c >= max_len else c
    target = TUNE.get("chunk_target", 4 if grad else 1) * _num_sms(device)
    min_len = _chunk_min_len(grad)
    per_sm = 1 if 8 <= next_pow2(m) <= 16 else 0.5
    below = TUNE.get("chunk_grad_below", per_sm) * _num_sms(device) if grad else target
    if m >= TUNE.get("chunk_max_m", MAX_M + 1) or max_len < min_len or nprog >= below:
        return None
    if m >= 16 and nprog >= _num_sms(device):  # m = 16, grad: B1 T16384 3.11 ms vs 5.56 one
        return None  # pass (48 programs), but B8 T2048 N768 (384) 3.33 ms vs 0.90 ms
    short = default_chunk(m, TUNE, nprog, max_len, _num_sms(device))
    if grad and m >= 4:
        chunk = TUNE.get("chunk_len_grad", short)
    elif grad:
        chunk = max(256, cdiv(max_len, cdiv(target, nprog)))
    else:
        chunk = TUNE.get("chunk_len", short)
    chunk = cdiv(chunk, align) * align
    return None if chunk >= max_len else chunk


# ----------------------------------------------------------------------------- m >= 2 kernels
def _bd_cfg(m):
    mp = next_pow2(m)
    # one 16-byte vector of A per thread and step keeps the time axis of a load group in-thread
    bh = TUNE.get("bh", max(1, 128 // (mp * mp)))
    nw = TUNE.get("num_warps", max(1, min(4, bh * mp * mp // 128)))
    ns = TUNE.get("num_stages", 3)
    return mp, bh, nw, ns


def _bwd_warps(mp, nw):
    """Warps of the ``m >= 2`` backward: ``_bd_cfg``'s, but 1 at ``mp = 16`` and 2 at ``mp = 32``
    (``TUNE['bwd_num_warps']``, or ``num_warps`` for both passes). Its chain step sums ``A^T lam``
    over the rows, which the 16-byte row loads spread over the warps: fewer warps keep that sum
    and the state's change of layout inside a warp. H200 fwd+bwd, m = 16: B8 T2048 N4096 3.85 ->
    3.69 ms, N768 0.883 -> 0.749, B1 T16384 1.48 -> 1.27; m = 32: 1.4-12 % (MEASURED.md)."""
    if "bwd_num_warps" in TUNE or "num_warps" in TUNE:
        return TUNE.get("bwd_num_warps", nw)
    return {16: 1, 32: 2}.get(mp, nw)


# Bands of the m >= 2 kernels on a GPU: {GPU: {(m, "fwd" | "bwd"): (((lo, hi), variant), ...)}} by
# programs per SM (``_host.device_band``; MEASURED.md), mostly where the default's last wave would
# be thin: m = 8 forward B9 N4096 85 -> 99 % of copy (ring2), fwd+bwd B5 52 -> 64 % (ring2), B9 58 ->
# 61 % (v1); m = 16 forward B5 76 -> 101 % (ring2), B9 88 -> 100 % (g4); m = 32 backward v1, fwd+bwd
# 1.4-7.8 % faster at B5-B10 N768 and B1 N4096, 2.3-2.5 % at B8 N4096 (lost at 1.94-2.18, 8.73);
# m = 8 forward ring8 (32 slots, as with few programs) at 3-7: B12 T1024 N768 70 -> 81 %, B16 86 -> 93 %;
# the same at m = 3, 5..7 (padded gather ring): m = 5 B8 T2048 N770 (4.7) 0.231 -> 0.197 ms, m = 3
# B16 T1024 N768 (3.9) 0.105 -> 0.091, m = 7 B16 T1024 N770 (6.7) 0.147 -> 0.139 (MEASURED.md).
_RING8_MID = ((3.0, 7.0), "ring8")
_VARIANT_BANDS = {"H200": {(8, "fwd"): (_RING8_MID, ((14.0, 24.0), "ring2")),
                           **{(m, "fwd"): (_RING8_MID,) for m in (3, 5, 6, 7)},
                           (8, "bwd"): (((8.0, 12.0), "ring2"), ((16.0, 20.0), "v1")),
                           (16, "fwd"): (((8.0, 14.0), "ring2"), ((16.0, 20.0), "g4")),
                           (32, "bwd"): (((0.9, 1.85), "v1"), ((7.0, 8.0), "v1"))}}


def _variant_band(m, nprog, device, bwd=False):
    """The ``_VARIANT_BANDS`` variant for ``nprog`` programs of block size ``m``, or None."""
    if device is None:
        return None
    return device_band(_VARIANT_BANDS, device, (m, "bwd" if bwd else "fwd"), nprog / _num_sms(device))


def _fwd_variant(few=False, m=0, nprog=0, device=None):
    """``ring8`` (``_bd_fwd_ring``, 32 slots), ``ring4`` (16), ``ring2`` (8), ``g4`` (4-step groups)
    or ``v1`` (one step a loop); ``TUNE['variant']`` overrides. ``few`` (unchunked, < 3 programs an
    SM, m <= 16): ring8 (more bytes in flight; spills at m = 32, lost in chunked passes); else ring4
    but in ``_VARIANT_BANDS`` (``m``, ``nprog`` on ``device``). README.md "Forward" ("Few programs")."""
    if "variant" in TUNE:
        return TUNE["variant"]
    return "ring8" if few else _variant_band(m, nprog, device) or "ring4"


def _bwd_variant(m, nprog, device=None):
    """Backward kernel, from forward+backward timings (README.md "Backward"). 1024+ programs:
    ring4 for m = 2, 5..8, ring2 for m = 3, 4, 17..32, v1 for m = 9..16. Fewer: ring4 for m = 2,
    ring2 above 16, v1 with 16 stages for m = 3..16 (``_bwd_launch``: its loads become ``cp.async``
    copies 15 steps ahead). ``_VARIANT_BANDS`` first (``device``; the H200's m = 32 bands take
    v1). ``TUNE['bwd_variant']`` overrides (``ring`` = ring2)."""
    if "bwd_variant" in TUNE:
        return TUNE["bwd_variant"]
    if (band := _variant_band(m, nprog, device, bwd=True)) is not None:
        return band
    mp = next_pow2(m)
    if mp == 32:
        return "ring2"
    if mp == 16:
        return "v1"
    if nprog < _BWD_FEW:  # H100 2026-11-25 / 26, CUDA-graph timings (GPU time only; docstring)
        return "v1" if mp >= 4 else "ring4"
    return "ring2" if mp == 4 else "ring4"


def _bwd_launch(grid, *args, M, MP, BH, NS, **kw):
    var = _bwd_variant(M, nprog := grid[0] * grid[1] * grid[2], args[0].device)
    if var.startswith("ring"):  # ring = ring2 (8 slots); ring4: 16 slots
        _bd_bwd_ring[grid](*args, M=M, MP=MP, BH=BH, R=int(var[4:] or 2), **kw)
    elif var == "g4":
        _bd_bwd_kernel_g4[grid](*args, M=M, MP=MP, BH=BH, **kw)
    else:  # few programs: a deep pipeline (_bwd_variant); TUNE['num_stages'] overrides
        deep, nsm = nprog < _BWD_FEW and "num_stages" not in TUNE, _num_sms(args[0].device)
        ns = _bwd_deep_stages(MP, nprog, nsm) if deep else NS
        kernel = _bd_bwd_gather if bwd_gather(TUNE, M, MP, nprog, nsm) else _bd_bwd_kernel
        kernel[grid](*args, M=M, MP=MP, BH=BH, NS=ns, **kw)


def _bwd_deep_stages(mp, nprog, nsm):
    """Pipeline stages of the one-step backward with few programs: 16, and 10 for ``m`` in 9..16
    from 2.75 programs per SM on; ``TUNE['bwd_ns']`` overrides. H100, fp32 fwd+bwd, N768 T2048,
    CUDA-graph medians of 3 rounds, ms, 16 against 10 stages (RESULTS.md, twenty-seventh session):
    B6 (2.2 programs per SM) 0.871 / 0.892, B7 (2.5) 0.903 / 0.924, B8 (2.9) 1.004 / 0.980,
    B9 (3.3) 1.225 / 1.148, B10 (3.6) 1.289 / 1.247, B12 (4.4) 1.579 / 1.529; B4 T4096 (1.45):
    16 the best of 8-20. At m = 8 10 or 12 stages were slower from B6 to B10."""
    if "bwd_ns" in TUNE:
        return TUNE["bwd_ns"]
    return 10 if mp == 16 and nprog >= 2.75 * nsm else 16


def _fwd_launch(grid, A, b, h, init, final, cu, T, H, CHUNK, NC, *, M, MP, BH, NS, few=False, **kw):
    var = _fwd_variant(few and M <= 16, M, grid[0] * grid[1] * grid[2], A.device)
    if var.startswith("ring"):
        _bd_fwd_ring[grid](A, b, h, init, final, final, cu, T, H, CHUNK, NC, M=M, MP=MP, BH=BH,
                           R=int(var[4:]), SUMMARY=False, GATHER=ring_gather(TUNE, M, MP), **kw)
    elif var == "g4":
        _bd_fwd_kernel_g4[grid](A, b, h, init, final, cu, T, H, CHUNK, NC, M=M, MP=MP, BH=BH, **kw)
    else:
        _bd_fwd_kernel[grid](A, b, h, init, final, cu, T, H, CHUNK, NC, M=M, MP=MP, BH=BH, NS=NS, **kw)


def _bd_forward(A, b, h0, cu, chunk, max_len=None):
    B, T, H, m = b.shape
    nseq = B if cu is None else cu.numel() - 1
    mp, bh, nw, ns = _bd_cfg(m)
    dev = b.device
    h = _empty(b.shape, b.dtype, dev)
    final = _empty((nseq, H, m), torch.float32, dev)
    dummy = b
    varlen = cu is not None
    cu_arg = cu if varlen else dummy
    if chunk is None:
        few = cdiv(H, bh) * nseq < 3 * _num_sms(dev)
        _fwd_launch((cdiv(H, bh), nseq, 1),
            A, b, h, h0 if h0 is not None else dummy, final, cu_arg, T, H, max(T, 1), 1,
            M=m, MP=mp, BH=bh, NS=ns, HAS_INIT=h0 is not None, STORE_H=True, STORE_FINAL=True,
            VARLEN=varlen, num_warps=nw, few=few)
        return h, final, None
    nc = cdiv(max_seq_len(T, cu, max_len), chunk)
    P = _empty((nseq, nc, H, m, m), torch.float32, dev)
    E = _empty((nseq, nc, H, m), torch.float32, dev)
    launch_summary(A, b, P, E, cu_arg, T, H, chunk, nc, nseq, m, bh, nw, ns, varlen, TUNE, _fwd_variant())
    X = _empty((nseq, nc, H, m), torch.float32, dev)
    _fwd_launch((cdiv(H, bh), nseq, 1),
        P, E, X, h0 if h0 is not None else dummy, final, dummy, nc, H, nc, 1,
        M=m, MP=mp, BH=bh, NS=ns, HAS_INIT=h0 is not None, STORE_H=True, STORE_FINAL=True,
        VARLEN=False, num_warps=nw)
    k = rerun_factor(chunk, nc, cdiv(H, bh) * nseq, _num_sms(dev), TUNE)  # k summary chunks a re-run
    first = (h0.float() if h0 is not None else torch.zeros(nseq, H, m, device=dev))[:, None]
    init = torch.cat([first, X[:, k - 1:nc - 1:k]], 1).contiguous()  # the carries into chunks 0, k, ..
    _fwd_launch((cdiv(H, bh), nseq, cdiv(nc, k)), A, b, h, init, dummy, cu_arg, T, H, chunk * k,
        cdiv(nc, k), M=m, MP=mp, BH=bh, NS=ns, HAS_INIT=True, STORE_H=True, STORE_FINAL=False,
        VARLEN=varlen, num_warps=nw)
    return h, final, P


def _bd_backward(A, h, h0, g, dhT, cu, chunk, P):
    B, T, H, m = h.shape
    nseq = B if cu is None else cu.numel() - 1
    mp, bh, nw, ns = _bd_cfg(m)
    bnw = _bwd_warps(mp, nw)  # the chunk carries' forward below keeps nw
    dev = h.device
    dA = _empty(A.shape, A.dtype, dev)
    db = _empty(h.shape, h.dtype, dev)
    dh0 = _empty((nseq, H, m), torch.float32, dev)
    varlen = cu is not None
    dummy = h
    cu_arg = cu if varlen else dummy
    h0_arg = h0 if h0 is not None else dummy
    grid1 = (cdiv(H, bh), nseq, 1)
    if chunk is None:
        _bwd_launch(grid1,
            A, h, h0_arg, g, dA, db, dhT if dhT is not None else dummy, dh0, cu_arg, T, H,
            max(T, 1), 1, M=m, MP=mp, BH=bh, NS=ns, HAS_H0=h0 is not None, HAS_MUIN=dhT is not None,
            STORE_GRADS=True, STORE_MUOUT=True, VARLEN=varlen, num_warps=bnw)
        return dA, db, dh0
    nc = P.shape[1]
    F = _empty((nseq, nc, H, m), torch.float32, dev)
    _bwd_launch((cdiv(H, bh), nseq, nc),
        A, h, h0_arg, g, dummy, dummy, dummy, F, cu_arg, T, H, chunk, nc,
        M=m, MP=mp, BH=bh, NS=ns, HAS_H0=False, HAS_MUIN=False, STORE_GRADS=False, STORE_MUOUT=True,
        VARLEN=varlen, num_warps=bnw)
    A2 = P.flip(1).transpose(-1, -2).contiguous()
    b2 = F.flip(1).contiguous()
    X = _empty((nseq, nc, H, m), torch.float32, dev)
    _fwd_launch(grid1,
        A2, b2, X, dhT if dhT is not None else dummy, dh0, dummy, nc, H, nc, 1,
        M=m, MP=mp, BH=bh, NS=ns, HAS_INIT=dhT is not None, STORE_H=True, STORE_FINAL=True,
        VARLEN=False, num_warps=nw)
    last = (dhT.float() if dhT is not None else torch.zeros(nseq, H, m, device=dev))[:, None]
    muin = torch.cat([X.flip(1)[:, 1:], last], 1).contiguous()
    _bwd_launch((cdiv(H, bh), nseq, nc),
        A, h, h0_arg, g, dA, db, muin, dummy, cu_arg, T, H, chunk, nc,
        M=m, MP=mp, BH=bh, NS=ns, HAS_H0=h0 is not None, HAS_MUIN=True, STORE_GRADS=True,
        STORE_MUOUT=False, VARLEN=varlen, num_warps=bnw)
    return dA, db, dh0


# ----------------------------------------------------------------------------- m == 1 kernels
_DIAG_FEW, _DIAG_FEW_BWD = (128, 16, 2), (64, 32, 2)  # few programs, fwd / bwd (README.md)
# (BT, BN, num_warps) of the m = 1 forward and (BT, BN) of its backward (4 warps) by GPU (a
# substring of the device name): B8 T2048 N4096 ranks the tiles differently on the two Hopper
# cards (RESULTS.md): H100 (16, 64, 2) 0.2802 ms against 0.2923, and with CUDA graphs fwd+bwd
# 0.7460 against 0.7646 (tools/diag_tile_vs_accel.py). H200 (2026-11-28, forward, medians of 5
# interleaved rounds, eager do_bench / CUDA graph, ms): (32, 64, 2) against the earlier (64, 32, 2)
# at B8 T2048 N4096 0.2022 / 0.2081 against 0.2036 / 0.2127, B8 T16384 1.579 / 1.582 against
# 1.646 / 1.651, B16 T2048, B8 T4096 and B8 T2048 N8192 0.3-1.9 % faster ((16, 64, 2): 0.2104 /
# 0.2040 at B8 T2048, slower eager there and at T16384 / N8192 by graph). H200 backward
# (2026-11-28, fwd+bwd, CUDA-graph medians of 5 interleaved rounds): (32, 64) 0.5225 / 4.160 ms
# against (64, 32) 0.5652 / 4.536 at B8 T2048 / T16384 N4096, 6-9 % faster at B16 T2048, B8 T4096,
# B8 T2048 N8192 too; (16, 64) 2-3 % behind (32, 64), (32, 128) and (64, 64) slower than (64, 32).
# Keys are substrings of the name: "NVIDIA GH200 ..." takes the H200 row (not measured there).
# On an H200 forwards of 2048+ steps run tma.py's TMA forward in the bands of _MANY_BY_DEVICE
# (fp32 from 4 programs an SM 64 x 64 on 2 warps, thirty-third session; at 2-2.55 and 3.3-4
# 16 x 64 on one warp, fortieth / forty-first; 16-bit its own bands, thirty-eighth to 41st).
# More warps per SM lost on the H200 (B8 T2048 N4096, L2 flushed: 4 warps 0.2023, 32 x 32
# tiles 0.2045 against 0.2010 ms): the walk through time over (B, T, N) is the
# limit, not the scan (tools/walk_order_probe.py; RESULTS.md, thirty-fifth session).
_DIAG_BY_DEVICE = {"H100": (16, 64, 2), "H200": (32, 64, 2)}  # H100 80GB HBM3 (SXM), H200
_DIAG_BWD_BY_DEVICE = {"H100": (16, 64), "H200": (32, 64)}
_DIAG_DEFAULT = (64, 32, 2)
# Wave-tail bands of the m = 1 tiles (``_host.device_band``; programs per SM counted at BN = 64),
# where the default tile would end in a thin last wave: {GPU: {"fwd" | "bwd": (((lo, hi), (BT, BN,
# num_warps)), ...)}}. 16-step tiles take half the registers (twice the programs per SM): H200 B9
# N4096 forward 0.3024 -> 0.2264 ms (and beat tma.py's TMA row there), B5 backward 0.2837 ->
# 0.2286; fwd+bwd against accelerated-scan (L2 flushed) B9 0.897x -> 0.990x (64 x 32), B13 0.940x
# -> 0.996x (16 x 64 on 2 warps) (MEASURED.md, "Wave-tail bands").
_DIAG_BANDS = {"H200": {"fwd": (((4.0, 7.0), (16, 64, 2)),),
                        "bwd": (((1.9, 3.5), (16, 64, 4)), ((4.0, 4.75), (64, 32, 4)),
                                ((6.0, 7.5), (16, 64, 2)))}}


def _diag_default(device, bwd=False):
    """The m = 1 tile ``(BT, BN, num_warps)`` for ``device``: ``_DIAG_BY_DEVICE`` forward,
    ``_DIAG_BWD_BY_DEVICE`` backward (CPU and other GPUs: 64 x 32); the backward on 4 warps (B8
    T2048 N4096 fwd+bwd 0.5629 ms against 0.7796 with 2, same run)."""
    name = device_name(device)
    cfg = row_by_name(_DIAG_BWD_BY_DEVICE if bwd else _DIAG_BY_DEVICE, name) or _DIAG_DEFAULT
    return cfg[:2] + (4,) if bwd else cfg


def _diag_band(N, nseq, device, bwd=False):
    """The ``_DIAG_BANDS`` tile for ``nseq`` rows of ``N`` channels on ``device``, or None."""
    per_sm = nseq * cdiv(N, 64) / _num_sms(device)
    return device_band(_DIAG_BANDS, device, "bwd" if bwd else "fwd", per_sm)


def _diag_cfg(N, nseq, device, bwd=False):
    """(BT, BN, num_warps, num_stages) of the m = 1 tiles: ``_diag_default`` (per GPU; B8 T2048
    N4096) or, in its bands, ``_diag_band``'s; below 4 programs per SM at BN = 32 ``_DIAG_FEW``
    (backward ``_DIAG_FEW_BWD``; keys ``bt_few``/``bn_few``/``nw_few``). TUNE keys ``bt``, ``bn``,
    ``num_warps_diag`` set both passes; the backward's own keys (``bt_bwd``, ``bn_bwd``,
    ``nw_bwd``) override them: its tiles need not match the forward's (chunks are any length)."""
    if nseq * cdiv(N, 32) < 4 * _num_sms(device):
        fw = _DIAG_FEW_BWD if bwd else _DIAG_FEW
        d = (TUNE.get("bt_few", fw[0]), TUNE.get("bn_few", fw[1]), TUNE.get("nw_few", fw[2]))
    else:
        d = _diag_band(N, nseq, device, bwd) or _diag_default(device, bwd)
    bt, bn, nw = TUNE.get("bt", d[0]), TUNE.get("bn", d[1]), TUNE.get("num_warps_diag", d[2])
    if bwd:
        bt, bn, nw = TUNE.get("bt_bwd", bt), TUNE.get("bn_bwd", bn), TUNE.get("nw_bwd", nw)
    return bt, bn, nw, TUNE.get("num_stages_diag", 3)


def _diag_forward(a, b, h0, cu, chunk, lookback=False, max_len=None):
    if lookback:  # one decoupled look-back pass (lookback.py); chunk only shapes P for a backward
        from .lookback import diag_lookback_forward
        return diag_lookback_forward(a, b, h0, cu, chunk, TUNE, _empty, _diag_cfg, max_len)
    B, T, N = b.shape
    nseq = B if cu is None else cu.numel() - 1
    many = b.element_size() == 2 or _diag_band(N, nseq, b.device) is None  # band: fp32 only
    tma_cfg = tma.tma_config(a, b, nseq, TUNE, _num_sms(b.device), many) if chunk is None else None
    if tma_cfg is not None:  # few programs on Hopper: loads by TMA (tma.py)
        return tma.diag_tma_forward(a, b, h0, cu, tma_cfg, _empty) + (None,)
    bt, bn, nw, ns = _diag_cfg(N, nseq, b.device)
    nv, vec = row_divisor(N), diag_vec(b.element_size(), TUNE)
    dev = b.device
    h = _empty(b.shape, b.dtype, dev)
    final = _empty((nseq, N), torch.float32, dev)
    varlen = cu is not None
    dummy = b
    cu_arg = cu if varlen else dummy
    gn = cdiv(N, bn)
    if chunk is None:
        _diag_fwd_kernel[(gn, nseq, 1)](
            a, b, h, h0 if h0 is not None else dummy, final, dummy, cu_arg, T, N, max(T, 1), 1,
            BT=bt, BN=bn, HAS_INIT=h0 is not None, STORE_H=True, STORE_FINAL=True, STORE_P=False,
            VARLEN=varlen, NV=nv, VEC=vec, num_warps=nw)
        return h, final, None
    nc = cdiv(max_seq_len(T, cu, max_len), chunk)
    P = _empty((nseq, nc, N), torch.float32, dev)
    E = _empty((nseq, nc, N), torch.float32, dev)
    _diag_fwd_kernel[(gn, nseq, nc)](
        a, b, dummy, dummy, E, P, cu_arg, T, N, chunk, nc, BT=bt, BN=bn, HAS_INIT=False,
        STORE_H=False, STORE_FINAL=True, STORE_P=True, VARLEN=varlen, NV=nv, VEC=vec, num_warps=nw)
    X = _empty((nseq, nc, N), torch.float32, dev)
    _diag_fwd_kernel[(gn, nseq, 1)](
        P, E, X, h0 if h0 is not None else dummy, final, dummy, dummy, nc, N, nc, 1,
        BT=bt, BN=bn, HAS_INIT=h0 is not None, STORE_H=True, STORE_FINAL=True, STORE_P=False,
        VARLEN=False, NV=nv, num_warps=nw)
    first = (h0.float() if h0 is not None else torch.zeros(nseq, N, device=dev))[:, None]
    init = torch.cat([first, X[:, :-1]], 1).contiguous()
    _diag_fwd_kernel[(gn, nseq, nc)](
        a, b, h, init, dummy, dummy, cu_arg, T, N, chunk, nc, BT=bt, BN=bn, HAS_INIT=True,
        STORE_H=True, STORE_FINAL=False, STORE_P=False, VARLEN=varlen, NV=nv, VEC=vec, num_warps=nw)
    return h, final, P


def _diag_backward(a, h, h0, g, dhT, cu, chunk, P, lookback=False, max_len=None):
    out = (tma_bwd.diag_tma_backward(a, h, h0, g, dhT, cu, TUNE, _num_sms(h.device), _empty, max_len)
           if lookback == "tma" else None)  # one pass by TMA (tma_bwd.py) where TMA takes the inputs
    if out is not None:
        return out
    if lookback:  # one look-back pass (lookback_bwd.py; _diag_bwd_lookback): no chunks needed
        from .lookback_bwd import diag_lookback_backward
        return diag_lookback_backward(a, h, h0, g, dhT, cu, TUNE, _empty, max_len)
    (B, T, N), dev = h.shape, h.device
    nseq = B if cu is None else cu.numel() - 1
    bt, bn, nw, ns = _diag_cfg(N, nseq, dev, bwd=True)
    per_sm = nseq * cdiv(N, bn) * (P.shape[1] if chunk is not None else 1) / _num_sms(dev)
    nv, vec = row_divisor(N), diag_vec(h.element_size(), TUNE, True, per_sm, bt)
    da = _empty(a.shape, a.dtype, dev)
    db = _empty(h.shape, h.dtype, dev)
    dh0 = _empty((nseq, N), torch.float32, dev)
    varlen = cu is not None
    dummy = h
    cu_arg = cu if varlen else dummy
    h0_arg = h0 if h0 is not None else dummy
    gn = cdiv(N, bn)
    if chunk is None:
        _diag_bwd_kernel[(gn, nseq, 1)](
            a, h, h0_arg, g, da, db, dhT if dhT is not None else dummy, dh0, cu_arg, T, N,
            max(T, 1), 1, BT=bt, BN=bn, HAS_H0=h0 is not None, HAS_MUIN=dhT is not None,
            STORE_GRADS=True, STORE_MUOUT=True, VARLEN=varlen, NV=nv, VEC=vec, num_warps=nw)
        return da, db, dh0
    nc = P.shape[1]
    F = _empty((nseq, nc, N), torch.float32, dev)
    _diag_bwd_kernel[(gn, nseq, nc)](
        a, h, h0_arg, g, dummy, dummy, dummy, F, cu_arg, T, N, chunk, nc, BT=bt, BN=bn,
        HAS_H0=False, HAS_MUIN=False, STORE_GRADS=False, STORE_MUOUT=True, VARLEN=varlen,
        NV=nv, VEC=vec, num_warps=nw)
    X = _empty((nseq, nc, N), torch.float32, dev)
    _diag_fwd_kernel[(gn, nseq, 1)](
        P.flip(1).contiguous(), F.flip(1).contiguous(), X, dhT if dhT is not None else dummy,
        dh0, dummy, dummy, nc, N, nc, 1, BT=bt, BN=bn, HAS_INIT=dhT is not None, STORE_H=True,
        STORE_FINAL=True, STORE_P=False, VARLEN=False, NV=nv, num_warps=nw)
    last = (dhT.float() if dhT is not None else torch.zeros(nseq, N, device=dev))[:, None]
    muin = torch.cat([X.flip(1)[:, 1:], last], 1).contiguous()
    _diag_bwd_kernel[(gn, nseq, nc)](
        a, h, h0_arg, g, da, db, muin, dummy, cu_arg, T, N, chunk, nc, BT=bt, BN=bn,
        HAS_H0=h0 is not None, HAS_MUIN=True, STORE_GRADS=True, STORE_MUOUT=False,
        VARLEN=varlen, NV=nv, VEC=vec, num_warps=nw)
    return da, db, dh0


# ----------------------------------------------------------------------------- autograd
def _run_forward(A, b, h0, cu, chunk, diag, lookback, max_len):
    """``(h, final, P)`` of a plan's forward (``plan.py``: ``chunk``, ``lookback``); ``P`` (chunk
    products, for the chunked backward) None where the forward did not chunk."""
    if diag:
        return _diag_forward(A, b, h0, cu, chunk, lookback, max_len)
    if lookback:  # the block look-backs are forward-only: no chunk products (P = None)
        lb = {"m2": bd2_lookback_forward, "m4": bd4_lookback_forward,
              "tma": tma_blocks.bd_tma_forward}.get(lookback, bd_lookback_forward)
        return lb(A, b, h0, cu, TUNE, _empty, max_len)
    return _bd_forward(A, b, h0, cu, chunk, max_len)


def _run_backward(A, h, h0, g, dhT, cu, chunk, P, diag, bwd_lookback, max_len):
    """``(dA, db, dh0)`` of a plan's backward (``bwd_lookback``; ``chunk`` and ``P`` the
    forward's chunks where it chunked)."""
    if diag:
        return _diag_backward(A, h, h0, g, dhT, cu, chunk, P, bwd_lookback, max_len)
    if bwd_lookback == "tma":  # after the TMA forward (tma_blocks_bwd.py)
        if tma_blocks_bwd.bd_tma_bwd_usable(A, h, g):
            return tma_blocks_bwd.bd_tma_backward(A, h, h0, g, dhT, cu, TUNE, _empty, max_len)
        return _bd_backward(A, h, h0, g, dhT, cu, None, P)  # e.g. g off 16-byte alignment
    if bwd_lookback:  # m = 2, 4 with few programs (lookback2_bwd.py, lookback4_bwd.py)
        lbb = bd4_lookback_backward if h.shape[-1] == 4 else bd2_lookback_backward
        return lbb(A, h, h0, g, dhT, cu, TUNE, _empty, max_len)
    return _bd_backward(A, h, h0, g, dhT, cu, chunk, P)


class _ScanFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, b, h0, cu, chunk, diag, lookback=False, bwd_lookback=False, max_len=None):
        h, final, P = _run_forward(A, b, h0, cu, chunk, diag, lookback, max_len)
        # an unused h or final state gets None, not a zero tensor: no zero fill, no read of it
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(A, h, h0, cu, P)
        ctx.chunk, ctx.diag, ctx.bwd_lookback, ctx.max_len = chunk, diag, bwd_lookback, max_len
        ctx.h0_dtype = None if h0 is None else h0.dtype
        return h, final

    @staticmethod
    def backward(ctx, dh, dfinal):
        A, h, h0, cu, P = ctx.saved_tensors
        g = torch.zeros_like(h) if dh is None else dh.contiguous()
        dhT = None if dfinal is None else dfinal.float().contiguous()
        dA, db, dh0 = _run_backward(A, h, h0, g, dhT, cu, ctx.chunk, P, ctx.diag, ctx.bwd_lookback,
                                    ctx.max_len)
        return dA, db, (dh0.to(ctx.h0_dtype) if h0 is not None else None), None, None, None, None, None, None


def block_diagonal_scan(A, b, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Block-diagonal linear recurrence ``h_t = A_t h_{t-1} + b_t`` with ``m x m`` blocks.

    Args:
        A: ``(B, T, H, m, m)`` transitions, ``1 <= m <= 32``; float32/bfloat16/float16, contiguous.
        b: ``(B, T, H, m)`` inputs.
        initial_state: optional ``(B or num_seqs, H, m)`` state ``h_0`` (any float dtype).
        output_final_state: also return the fp32 final state ``(B or num_seqs, H, m)``.
        cu_seqlens: optional int64 ``(num_seqs + 1,)`` offsets of packed sequences (``B == 1``).

    Returns:
        ``(h, h_final or None)``; ``h`` has ``b``'s shape and dtype. Differentiable in ``A``, ``b``
        and ``initial_state``.
    """
    _check_float("A", A, 5, "(B, T, H, m, m)")
    _check_float("b", b, 4, "(B, T, H, m)")
    B, T, H, m = b.shape
    if tuple(A.shape) != (B, T, H, m, m):
        raise ValueError(f"A must have shape (B, T, H, m, m) = {(B, T, H, m, m)} to match b "
                         f"{tuple(b.shape)}, got {tuple(A.shape)}")
    if not 1 <= m <= MAX_M:
        raise ValueError(f"block size m (b.shape[-1]) must be in 1..{MAX_M}, got {m}")
    if A.device != b.device:
        raise ValueError(f"A and b must be on one device, got A on {A.device}, b on {b.device}")
    nseq, max_len = _check_common(b, "b", B, T, (H, m), initial_state, cu_seqlens)
    h0 = initial_state.contiguous() if initial_state is not None else None
    cu = cu_seqlens.to(torch.int64).contiguous() if cu_seqlens is not None else None
    if m == 1:
        h, final = _diag_apply(A.view(B, T, H), b.view(B, T, H),
                               None if h0 is None else h0.view(nseq, H), cu, nseq, max_len)
        h, final = h.view(B, T, H, 1), final.view(nseq, H, 1)
    else:
        h, final = _bd_apply(A, b, h0, cu, nseq, max_len)
    return h, (final if output_final_state else None)


def _needs_grad(*xs):
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


def _bd_apply(A, b, h0, cu, nseq, max_len):
    from .plan import bd_plan  # plan.py reads this module's rules (so not imported at its top)
    chunk, lookback, bwd_lb = bd_plan(A, b, nseq, max_len, _needs_grad(A, b, h0))
    return _ScanFn.apply(A, b, h0, cu, chunk, False, lookback, bwd_lb, max_len)


def _diag_apply(a, b, h0, cu, nseq, max_len):
    B, T, N = b.shape
    if TUNE.get("diag_variant", "tile") == "ring":  # the block kernels with m = 1
        h, final = _bd_apply(a.view(B, T, N, 1, 1), b.view(B, T, N, 1),
                             None if h0 is None else h0.view(nseq, N, 1), cu, nseq, max_len)
        return h.view(B, T, N), final.view(nseq, N)
    from .plan import diag_plan
    chunk, lookback, bwd_lb = diag_plan(b, nseq, max_len, _needs_grad(a, b, h0), cu is not None)
    return _ScanFn.apply(a, b, h0, cu, chunk, True, lookback, bwd_lb, max_len)


def diagonal_scan(a, b, initial_state=None, output_final_state=False, cu_seqlens=None, *,
                  time_dim=1):
    """Diagonal linear recurrence ``h_t = a_t * h_{t-1} + b_t`` (the m = 1 block case).

    Args:
        a, b: ``(B, T, N)``, or ``(B, N, T)`` with ``time_dim=2`` (time contiguous, as
            accelerated-scan takes it; kernels in ``time_major.py``); float32/bfloat16/float16,
            contiguous.
        initial_state: optional ``(B or num_seqs, N)``.
        output_final_state: also return the fp32 final state ``(B or num_seqs, N)``.
        cu_seqlens: optional int64 ``(num_seqs + 1,)`` offsets along time (``B == 1``).
        time_dim: 1 (default) or 2 (``-1``): which dim of ``a``/``b``/``h`` is time. With 2 the
            ``B * N`` rows are the only parallelism (time is not split): with fewer rows than
            the GPU has SMs and long sequences the ``(B, T, N)`` layout is faster.

    Returns:
        ``(h, h_final or None)``; ``h`` has ``b``'s shape and dtype.
    """
    _check_time_dim(time_dim)
    doc = "(B, T, N)" if time_dim == 1 else "(B, N, T)"
    _check_float("a", a, 3, doc)
    _check_float("b", b, 3, doc)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape {doc}, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"a and b must be on one device, got a on {a.device}, b on {b.device}")
    B, T, N = b.shape if time_dim == 1 else (b.shape[0], b.shape[2], b.shape[1])
    nseq, max_len = _check_common(b, "b", B, T, (N,), initial_state, cu_seqlens)
    h0 = initial_state.contiguous() if initial_state is not None else None
    cu = cu_seqlens.to(torch.int64).contiguous() if cu_seqlens is not None else None
    if time_dim == 1:
        h, final = _diag_apply(a, b, h0, cu, nseq, max_len)
    else:
        h, final = TimeMajorScanFn.apply(a, b, h0, cu, max_len, TUNE, _empty)
    return h, (final if output_final_state else None)
