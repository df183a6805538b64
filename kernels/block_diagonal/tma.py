"""The m = 1 (diagonal) forward on ``(B, T, N)`` with ``a`` and ``b`` loaded by the tensor-memory
accelerator (TMA, Hopper's bulk tensor copy engine) into shared memory.

Why: with few programs (B8 T2048 N768) the tile kernel (``fwd._diag_fwd_kernel``: 128 x 16
tiles on 2 warps, the next tile prefetched into registers) ran at about 80 % of copy. On one warp
(no cross-warp barrier in the tile's ``tl.associative_scan``) it ran at 30-48 %, our reading
(not profiled): a warp's registers hold too few prefetched bytes. TMA copies land in shared memory without holding registers: Triton's pipeliner turns
the descriptor loads of a ``tl.range(num_stages=NS)`` loop into asynchronous bulk copies, ``NS - 1``
tiles ahead, so one warp a 64-step tile is enough (91-95 % of a same-size copy on an H100 and an
H200; ``tma_config`` has the numbers). With many programs on an H200 (fp32, ``T >= 2048``, at
least 4 programs an SM) it runs too, on 64 x 64 tiles with 2 warps (``_MANY_BY_DEVICE``):
1.7-5.1 % faster than the tile kernel there on a warm L2, equal on a cold one; at 2-2.55 programs
an SM and at 3.3-4 on 16 x 64 tiles on one warp (2-5 % faster, cold); bf16 / fp16 by their
own rows.

Semantics are the tile kernel's: ``h_t = a_t h_{t-1} + b_t`` on ``(BT, BN)`` tiles, an in-tile
``tl.associative_scan`` over time composed with the carried state. The descriptors have shape
``(B, T, N)`` (``(1, T_total, N)`` with ``cu_seqlens``) and ``(1, BT, BN)`` boxes: TMA fills zeros
past ``T``, and with ``cu_seqlens`` a tile may run on into the next sequence. Rows at or past
``eos`` are replaced by the identity step ``(1, 0)`` in registers, so the tile's last row is the
state at ``eos - 1``; stores are masked. TMA coordinates are int32 (``tma_usable`` refuses
``T >= 2^31``); store offsets are int64.

Requirements (``tma_usable``): a CUDA GPU of compute capability 9 or newer, or the interpreter;
one dtype for ``a`` and ``b``; contiguous tensors; rows of ``N * itemsize`` bytes a multiple of 16
and 16-byte-aligned bases (TMA's rules); ``BN * itemsize >= 16``. Elsewhere the tile kernel runs.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .._host import band_choice, cdiv, device_name, row_by_name
from .fwd import _affine_combine

try:  # Triton >= 3.3 (host-side descriptors); older Triton: the tile kernel only
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - both supported Tritons (3.6, 3.9) have it
    TensorDescriptor = None


@triton.jit
def tma_seq(CU, s, T, VARLEN: tl.constexpr):
    """``(bos, eos, sd)`` of sequence ``s``: its rows, and its index in the descriptors' first
    axis (0 with ``cu_seqlens``: descriptors of shape ``(1, T_total, .)``; else ``s``, and a tile
    never crosses into the next sequence)."""
    if VARLEN:
        bos = tl.load(CU + s).to(tl.int32)
        eos = tl.load(CU + s + 1).to(tl.int32)
        sd = s * 0
    else:
        bos = s * 0
        eos = T + s * 0
        sd = s
    return bos, eos, sd


@triton.jit
def tma_program(CU, T, N, BN: tl.constexpr, VARLEN: tl.constexpr):
    """An ``m = 1`` program's sequence (grid axis 1) and channel tile (axis 0): ``(s, bos, eos,
    sd, n0, n, mn)``, ``tma_seq``'s rows and the tile's ``BN`` channels ``n`` from ``n0``, ``mn``
    those below ``N`` (the TMA forward's and backward's, ``tma_bwd.py``)."""
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    bos, eos, sd = tma_seq(CU, s, T, VARLEN)
    n0 = pid_n * BN
    n = n0 + tl.arange(0, BN)
    return s, bos, eos, sd, n0, n, n < N


@triton.jit
def tma_store_rows(Hout, hv, row0, t, ok, c, mc, W):
    """Store the ``(BT, C)`` tile ``hv`` at rows ``row0 + t`` (int64) and columns ``c`` of ``Hout``
    (rows of ``W`` elements), where ``ok`` (row in its sequence) and ``mc`` (column in range)."""
    offs = (row0 + t.to(tl.int64))[:, None] * W + c[None, :]
    tl.store(Hout + offs, hv.to(Hout.dtype.element_ty), mask=ok & mc[None, :])


@triton.jit
def tma_tile_store(Hout, SH, hv, row0, sd, ts, t, ok, c, mc, W, c0, TSTORE: tl.constexpr):
    """Store the ``(BT, C)`` tile ``hv`` of rows ``ts ..`` of batch row ``sd``: by TMA through the
    descriptor ``SH`` (``(B, T, W)``, columns from ``c0``; rows past ``T`` are clipped, so only
    without varlen, where rows past ``eos`` are the next sequence's) or ``tma_store_rows``."""
    if TSTORE:
        SH.store([sd, ts, c0], hv.reshape(1, hv.shape[0], hv.shape[1]).to(SH.dtype))
    else:
        tma_store_rows(Hout, hv, row0, t, ok, c, mc, W)


@triton.jit(do_not_specialize=["T"])
def _diag_fwd_tma_kernel(DA, DB, Hout, Init, Final, CU, T, N, BT: tl.constexpr, BN: tl.constexpr,
                         NS: tl.constexpr, HAS_INIT: tl.constexpr, VARLEN: tl.constexpr):
    s, bos, eos, sd, n0, n, mn = tma_program(CU, T, N, BN, VARLEN)
    r = tl.arange(0, BT)
    last = (r == BT - 1)[:, None]
    if HAS_INIT:
        x = tl.load(Init + s.to(tl.int64) * N + n, mask=mn, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BN], dtype=tl.float32)
    row0 = sd.to(tl.int64) * T
    for i in tl.range(0, tl.cdiv(eos - bos, BT), num_stages=NS):
        ts = bos + i * BT
        t = ts + r
        ok = (t < eos)[:, None]
        av = tl.where(ok, DA.load([sd, ts, n0]).reshape(BT, BN).to(tl.float32), 1.0)
        bv = tl.where(ok, DB.load([sd, ts, n0]).reshape(BT, BN).to(tl.float32), 0.0)
        ca, cb = tl.associative_scan((av, bv), 0, _affine_combine)
        # the tile's map x -> P x + E (its last row) does not depend on x: reduced off the serial
        # chain, which is then one FMA a tile (the same arithmetic as h's last row)
        P = tl.sum(tl.where(last, ca, 0.0), axis=0)
        E = tl.sum(tl.where(last, cb, 0.0), axis=0)
        hv = ca * x[None, :] + cb
        tma_store_rows(Hout, hv, row0, t, ok, n, mn, N)
        x = P * x + E
    tl.store(Final + s.to(tl.int64) * N + n, x, mask=mn)


@functools.lru_cache(maxsize=None)
def _major(index: int) -> int:
    """Compute capability major of CUDA device ``index`` (cached: the query costs microseconds)."""
    return torch.cuda.get_device_capability(index)[0]


def tma_tensors_ok(*xs: torch.Tensor) -> bool:
    """Whether every tensor of ``xs`` (``(B, T, ...)``, read as ``(B, T, row)``) can back a TMA
    descriptor (module doc): not empty (no descriptor of size 0), contiguous, a 16-byte-aligned base
    and time stride, ``B`` and ``T`` under 2^31 - 1; on a CUDA device of compute capability 9+, or
    under the interpreter. Shared by the forwards' ``tma_usable`` and the backwards' checks."""
    if TensorDescriptor is None:
        return False
    x0 = xs[0]
    if x0.device.type == "cuda":
        if _major(x0.device.index if x0.device.index is not None else torch.cuda.current_device()) < 9:
            return False
    elif os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    return all(x.numel() > 0 and x.is_contiguous() and x.data_ptr() % 16 == 0
               and (x.stride(1) * x.element_size()) % 16 == 0
               and x.shape[0] < 2 ** 31 - 1 and x.shape[1] < 2 ** 31 - 1 for x in xs)


def tma_usable(a: torch.Tensor, b: torch.Tensor, box: int) -> bool:
    """Whether ``a``, ``b`` (one dtype) meet TMA's rules (``tma_tensors_ok``) for tiles ``box``
    elements of ``b`` wide (at least 16 bytes)."""
    return a.dtype == b.dtype and box * b.element_size() >= 16 and tma_tensors_ok(a, b)


def tma_auto(N: int, nseq: int, sms: int) -> bool:
    """The "auto" rule on a GPU: fewer than 4 programs per SM at BN = 32 (the tile kernel's
    few-programs case, ``scan._DIAG_FEW``) but at least one per SM at BN = 16."""
    return nseq * cdiv(N, 32) < 4 * sms and nseq * cdiv(N, 16) >= sms


# Many programs (``tma_auto`` leaves the tile kernel there): rows ``((lo, hi), (BT, BN,
# num_warps, num_stages))`` by GPU (a substring of its name; a GH200 takes the H200 row, not
# measured there) and element size; ``_many_cfg`` takes the first with ``lo <= per_sm < hi``,
# ``per_sm = nseq * cdiv(N, 64) / SMs`` (``scan._diag_band``'s count), for ``T >= _MANY_MIN_T``
# only. Measured
# on an H200 (RESULTS.md, the sessions named), ms unless a ratio; "x accel" is speed relative to
# accelerated-scan's forward in the same rounds, L2 flushed before each replay.
#
# fp32 64 x 64 on 2 warps (from 3.8 an SM in the thirty-third session, from 4 since the forty-first;
# below, the one-warp rows), against the tile kernel (32 x 64, 2 warps): B8 T2048 N4096 0.1964
# / 0.2070, B8 T16384 N4096 1.5392 / 1.5651, B16 T2048 N2048
# 0.1983 / 0.2070, B32 T2048 N1024 0.2011 / 0.2078, B8 T4096 N8192 0.7695 / 0.7830 (1.7-5.1 %
# faster; a same-size copy 0.1910 at B8 T2048 N4096), with a warm L2; L2 flushed they tie, 0.2006
# / 0.1998 (thirty-fourth). Slower there: 64 x 64 on 4 warps or with 2 stages, 32 x 64 (2 warps,
# 3 or 4 stages), 32 x 128 on 4 warps, the few-program configuration. Not from below 3.8: this
# row fits 2 programs an SM (shared memory) where the tile kernel fits 4, and each program walks
# the whole sequence, so below about 4 an SM the grid ends in a partly empty second wave. B N4096
# T2048, this row / tile kernel (thirty-fifth): B5 0.1926 / 0.1302, B6 0.1951 / 0.1481, B7 0.1969
# / 0.1762 (3.4 an SM), B8 0.2006 / 0.2010 (3.9), B9 0.2870 / 0.3047, B12 0.2977 / 0.3291. The
# scan passes ``many=False`` in its forward 16-step band (``scan._diag_band``: 4-7 an SM, B9-B14
# at N4096), where those tiles beat this row (B9 0.2264 / 0.2861; thirty-sixth).
# fp32 at 2-2.55 an SM, 16 x 64 on ONE warp, 4 stages (fortieth session; why it wins is not
# profiled; our reading: TMA copies keep more bytes in flight without holding registers). Tile
# kernel -> this row, x accel, forward (fwd+bwd): B5 T2048 N4096 0.939 / 0.926 / 0.925 -> 0.977
# / 0.969 / 0.966 in three calls (0.943 -> 0.958); B5 T4096 0.938 -> 0.984 (0.949 -> 0.966);
# B5 T16384 0.954 -> 1.007 (0.957 -> 0.975); B10 T2048 N2048 0.930 -> 0.965; B20 N1024 0.936 ->
# 0.970; B9 N2048 (2.18 an SM) 0.882 -> 0.929; B19 N1024 (2.30) 0.921 -> 0.964. Outside the band it
# lost: B4 N4096 (1.94) 0.908 -> 0.849, B11 N2048 (2.67) 0.964 -> 0.954, B23 N1024 (2.79) 0.964
# -> 0.934, B6 N4096 (2.91) 0.973 -> 0.944 (3 stages 0.931). 16 x 128 / 16 x 256 tiles (no lane
# along time: 0 shuffles in the PTX against 269 for 64 x 64) ran no faster at B8 (0.945-0.959
# against 0.955). fp32 at 3.3-3.8 an SM, the same tiles with 3 stages (4: B7 0.916, 5: 0.890):
# B7 T2048 N4096 (3.39) 0.947 / 0.948 -> 0.978 / 0.974 in two calls, B7 T4096 0.953 -> 0.988,
# B14 N2048 (3.39) 0.953 -> 0.978, B29 N1024 (3.52) 0.955 -> 0.974, B15 N2048 (3.64) 0.951 ->
# 0.980 (fwd+bwd +0.6-1.5 %); B13 N2048 (3.15) 0.960 -> 0.964, a tie, left out. The band runs
# on to 4.0 (forty-first, against 64 x 64 on 2 warps, x accel, forward): B8 T2048 N4096 (3.88)
# 0.954 -> 0.972 / 0.971 / 0.971 in three calls (fwd+bwd +1.0-1.2 %), B8 T4096 0.972 -> 0.983,
# B8 T16384 0.987 -> 0.993, B16 N2048 0.958 -> 0.975, B32 N1024 0.984 -> 0.997, B4 N8192 0.949 ->
# 0.972; from 4.0 the scan's 16-step band (``many=False``) takes the forward. 32 x 64 on one warp
# lost at B8 (0.940).
#
# 16-bit: the tile kernel's tiles ran bf16 at 0.62x accel (B8 T2048 N4096; T16384 0.63x), the
# one-warp 64 x 32 TMA tiles 0.82x / 0.67x (thirty-eighth). From 4.2 an SM 16 x 128 tiles on one
# warp run faster (fortieth session, x accel, 64 x 32 -> 16 x 128, forward (fwd+bwd)): B9 T2048
# N4096 0.753 -> 0.857 (0.989 -> 1.032), B12 0.796 -> 1.092 (1.048 -> 1.148), B16 0.740 -> 1.050,
# B24 0.877 -> 1.004, B12 T4096 0.696 -> 1.083 (1.001 -> 1.157). Below, they lost: B6 T2048 /
# T16384 (2.9) 0.876 / 0.826 -> 0.600 / 0.578, B4 T16384 0.861 -> 0.389. At 2.9-4.2 an SM 32 x 64
# tiles on one warp, 4 stages (forty-first, against the row they replace, forward (fwd+bwd)): B8
# T2048 N4096 (3.88) 0.854 -> 1.051 (1.016 -> 1.069), B8 T16384 0.761 (then 16 x 128) -> 1.018
# (0.984 -> 1.075), B7 (3.39) 0.943 -> 0.974, B6 (2.91) 0.872 -> 0.898, B15 N2048 (3.64) 0.813 ->
# 0.990, B29 N1024 (3.52) 0.824 -> 0.967, B17 N2048 (4.12) 0.734 -> 0.774; B5 (2.42) a tie (0.764
# / 0.761); B9 (4.36) keeps 16 x 128 (0.864 / 0.823). 16 x 64 on one warp (4-8 stages) won at
# 3.6-4.1 by less and lost at 3.39 and 4.36. ptxas (Triton 3.6, sm_90a): 255 registers for the
# bf16 32 x 64 tile on one warp, no spills (16 x 128: 144; fp32 16 x 64: 80). From 3.45 an SM the
# same tiles with 3 stages (forty-second, 4 -> 3 stages, x accel, forward): B29 N1024 (3.52) 0.934
# -> 0.956 (a later call 0.975 -> 0.970), B15 N2048 (3.64) 0.957 -> 0.973, B8 T2048 N4096 (3.88)
# 1.020 / 1.022 -> 1.028 / 1.026 in two calls, B16 T16384 N2048 1.020 -> 1.034, B33 N1024 (4.0)
# 0.979 -> 1.016, B17 N2048 (4.12) 0.764 -> 0.805 (fwd+bwd +0-1.2 %); B8 T16384 lost 0.5 % in two
# calls (1.049 -> 1.042). Below 3.45 4 stages stay: B7 (3.39) 0.965 against 0.956, B6 (2.91) 0.891
# against 0.874.
_MANY_BY_DEVICE = {"H200": {
    4: (((2.0, 2.55), (16, 64, 1, 4)),
        ((3.3, 4.0), (16, 64, 1, 3)),
        ((4.0, float("inf")), (64, 64, 2, 3))),
    2: (((4.2, float("inf")), (16, 128, 1, 4)),
        ((3.45, 4.2), (32, 64, 1, 3)),
        ((2.9, 3.45), (32, 64, 1, 4)),
        ((1.9, float("inf")), (64, 32, 1, 3)))}}
# "auto" takes TMA only where rows (N elements) are a multiple of 64 bytes: below that the boxes
# start off 64-byte boundaries and the TMA forward lost to the tile kernel, H200 fp32 B8 T2048, L2
# flushed, TMA / tile ms (thirty-sixth session): N4104 (32-byte rows) 0.3017 / 0.2138, N4100
# 0.3005 / 0.2258, N776 (few programs) 0.0557 / 0.0512; 64-byte rows kept their TMA lead: N4112
# 0.2021 / 0.2117, N784 0.0453 / 0.0504, N4160 (128-byte) 0.2004 / 0.2016.
_AUTO_ROW_ALIGN = 64
# the shortest sequences any row takes (the measured range): shorter calls keep the tile kernel,
# whose launch costs the host less (no descriptors to encode; README.md, "m = 1 with TMA loads")
_MANY_MIN_T = 2048


def _many_cfg(b, N: int, nseq: int, sms: int):
    """The first ``_MANY_BY_DEVICE`` row of ``b``'s GPU and element size (fp32, or 16-bit) whose
    band holds ``nseq * cdiv(N, 64) / sms`` programs an SM, for ``b`` ``(B, T, N)``; None if none
    (other GPUs, 8-byte elements) or ``T < _MANY_MIN_T``."""
    if b.shape[1] < _MANY_MIN_T:
        return None
    rows = (row_by_name(_MANY_BY_DEVICE, device_name(b.device)) or {}).get(b.element_size(), ())
    return band_choice(rows, nseq * cdiv(N, 64) / sms, right_closed=False)


def _auto_takes(b, nseq: int, sms: int, many: bool) -> bool:
    """The "auto" rule for ``b`` ``(B, T, N)`` on a GPU: rows of ``_AUTO_ROW_ALIGN`` bytes and
    ``tma_auto`` or ``many`` (``_many_cfg`` found a row)."""
    N = b.shape[-1]
    return N * b.element_size() % _AUTO_ROW_ALIGN == 0 and (tma_auto(N, nseq, sms) or many)


def tma_config(a, b, nseq: int, tune: dict, sms: int, many: bool = True):
    """``(BT, BN, num_warps, num_stages)`` of the TMA forward for ``a``, ``b`` ``(B, T, N)``, or
    None where the tile kernel runs. ``tune["diag_tma"]``: "auto" (the default: ``tma_auto`` on a
    GPU, or many programs (``_many_cfg``; ``many=False``: not): a band of ``_MANY_BY_DEVICE`` for
    the GPU and element size; either only where rows are ``_AUTO_ROW_ALIGN``-byte aligned), True
    (wherever
    ``tma_usable``: compute capability 9+, or the interpreter) or False. Keys ``tma_bt``,
    ``tma_bn``, ``tma_nw``, ``tma_ns`` override the configuration: with many programs the
    device's row; else 64-step tiles on one warp (no cross-warp barrier in the tile's scan), 16
    channels while that makes at most 4 programs per SM (else 32), 3 pipeline stages, 4 with 16
    channels and up to 3 programs per SM except on an H100 (the two Hopper cards disagree;
    numbers below).

    fp32, CUDA graphs, % of a same-size copy, tile kernel -> TMA (RESULTS.md, twenty-third
    session). H200: B8 T2048 N768 81 -> 91 % (3 stages: 86 %), B8 T1024 N768 78 -> 90 % (84 %),
    B8 T4096 N768 81 -> 90 % (86 %), B16 T2048 N512 71 -> 92 % (4 stages: 77 %), B8 T2048 N1536
    69 -> 85 % (4 stages: 80 %); 2 warps at B8 T2048 N768: 70 %. H100 80GB HBM3: B8 T2048 N768
    80 -> 93 % (4 stages: 82 %), B8 T1024 N768 84 -> 92 % (89 %), B8 T4096 N768 80 -> 95 % (82 %),
    B16 T2048 N512 76 -> 84 %, B8 T2048 N1536 80 -> 87 %. Left to the tile kernel: B8 T2048
    N4096 (not few; H200 88 % against 78-85 % with these one-warp tiles; on an H200 the 64 x 64
    two-warp row of ``_MANY_BY_DEVICE`` beats it since the thirty-third session; not measured on
    an H100), B1 T2048 N768 and B2 T1024 N768 (48 / 96 programs; H200 0.0295 / 0.0157 ms against
    0.0319 / 0.0167)."""
    mode = tune.get("diag_tma", "auto")
    if mode not in (True, False, "auto"):
        raise ValueError(f'TUNE["diag_tma"] must be "auto", True or False, got {mode!r}')
    N = b.shape[-1]
    many = _many_cfg(b, N, nseq, sms) if many else None
    if mode == "auto":
        mode = b.is_cuda and _auto_takes(b, nseq, sms, many is not None)
    if many is not None:
        bt, bn, nw, ns = many
        bn = tune.get("tma_bn", bn)
    else:
        bt, nw = 64, 1
        bn = tune.get("tma_bn", 16 if nseq * cdiv(N, 16) <= 4 * sms else 32)
        four = bn == 16 and nseq * cdiv(N, bn) <= 3 * sms and "H100" not in device_name(b.device)
        ns = 4 if four else 3
    if not mode or not tma_usable(a, b, bn):
        return None
    return tune.get("tma_bt", bt), bn, tune.get("tma_nw", nw), tune.get("tma_ns", ns)


def diag_tma_forward(a, b, h0, cu, cfg, empty):
    """``(h, final)`` of the m = 1 forward through ``_diag_fwd_tma_kernel``: ``a``, ``b``, ``h``
    ``(B, T, N)`` (``B == 1`` with ``cu_seqlens``), ``final`` fp32 ``(nseq, N)``; ``cfg`` from
    ``tma_config``, ``empty`` the scan's allocator (NaN under poisoning)."""
    B, T, N = b.shape
    bt, bn, nw, ns = cfg
    nseq = B if cu is None else cu.numel() - 1

    def desc(t):
        return TensorDescriptor(t, shape=[B, T, N], strides=[T * N, N, 1], block_shape=[1, bt, bn])

    h = empty(b.shape, b.dtype, b.device)
    final = empty((nseq, N), torch.float32, b.device)
    _diag_fwd_tma_kernel[(cdiv(N, bn), nseq)](
        desc(a), desc(b), h, h0 if h0 is not None else b, final, cu if cu is not None else b,
        T, N, BT=bt, BN=bn, NS=ns, HAS_INIT=h0 is not None, VARLEN=cu is not None, num_warps=nw)
    return h, final
