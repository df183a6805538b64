"""Host-side helpers of the launchers: integer arithmetic and the SM count, without per-call cost.

``triton.cdiv`` and ``triton.next_power_of_2`` are ``@triton.jit`` functions: called from Python
each goes through ``JITFunction.__call__`` (a few microseconds). ``torch.cuda.get_device_properties``
costs about as much again. A scan launch asks for these several times, and at B8 T2048 N768 the
GPU work of a forward+backward is ~0.2 ms while its host side took ~0.6 ms (H100, Triton 3.6,
``tools/host_overhead.py``), so the launchers use these instead.
"""
from __future__ import annotations

import torch

_SMS: dict = {}
_NAMES: dict = {}


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints."""
    return -(-a // b)


def row_divisor(n: int) -> int:
    """The largest power of two (at most 16) dividing the row length ``n``: a kernel that gets it
    as a constexpr can prove its rows that aligned (Triton marks int arguments only by divisibility
    by 16), so ``N = 4104`` still loads 16-byte vectors (``block_diagonal/fwd._diag_fwd_kernel``)."""
    return min(16, n & -n) if n > 0 else 16


def diag_vec(itemsize: int, tune: dict, bwd: bool = False, per_sm: float = 0.0, bt: int = 0) -> int:
    """``VEC`` of the m = 1 kernels that load by pointer (``block_diagonal.fwd._diag_fwd_kernel``,
    ``bwd._diag_bwd_kernel``, the look-backs): the most channels a lane loads at once, 0 for no
    cap. 16-bit inputs get 4, fp32's layout: left alone, a 16-byte vector holds 8 bf16 channels, so
    more of a tile's lanes lie along time and its scan shuffles more (Triton 3.6 PTX, 32 x 64
    tiles: forward 210 shuffles against 134, backward on 4 warps 116 against 72; the look-back's
    128 x 32: 318 against 222). H200 bf16, L2 flushed, ms without / with the cap (thirty-ninth
    session): tile forward B8 T2048 N4096 0.1769 / 0.1662, B8 T16384 1.3531 / 1.2823, N4104
    0.1830 / 0.1725; look-back forward B1 T16384 N768 0.0693 / 0.0643.

    The backward (``bwd``) takes it only on tiles of at most 32 steps (``bt``) and up to 4
    programs an SM (``per_sm``, counted on its own grid): its capped tiles need more registers
    (32 x 64 on 4 warps: 213 against 164, ptxas), so fewer fit an SM. fwd+bwd without / with it:
    B8 T2048 N4096 (32 x 64, 3.9 an SM) 0.4511 / 0.4025, N4104 0.5474 / 0.4500, B5 (16 x 64,
    2.4) 0.3450 / 0.3132; lost: B12 (32 x 64, 5.8) 0.5789 / 0.6112, B9 (64 x 32, 8.7) 0.4613 /
    0.5245, B4 (64 x 32 on 2 warps, 3.9) 0.1964 / 0.2656. The look-back backward (its 128 x 32
    tiles: 144 registers against 138) takes it everywhere: B1 / B2 T16384 N768 0.1458 / 0.1390
    and 0.2699 / 0.2570 ms with the forward capped either way. TUNE ``diag_vec`` sets the
    forward's and the backward's where it takes one, ``diag_vec_bwd`` the backward's anywhere."""
    vec = tune.get("diag_vec", 4 if itemsize == 2 else 0)
    return tune.get("diag_vec_bwd", vec if per_sm <= 4 and bt <= 32 else 0) if bwd else vec


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def max_seq_len(T: int, cu_seqlens, known: int | None = None) -> int:
    """The longest sequence of a batch: ``T`` without ``cu_seqlens``, else the largest step of the
    offsets (one device sync); 0 when the offsets hold no sequence. ``known``: the value if the
    caller has it already (the argument checks read the offsets on the host), returned as is."""
    if known is not None:
        return known
    if cu_seqlens is None:
        return T
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item()) if cu_seqlens.numel() > 1 else 0


def num_sms(device: torch.device, cpu: int = 8) -> int:
    """Streaming multiprocessors of a CUDA device (cached per device); ``cpu`` elsewhere (the
    interpreter), so that launch rules are exercised on the CPU too."""
    if device.type != "cuda":
        return cpu
    idx = device.index if device.index is not None else torch.cuda.current_device()
    sms = _SMS.get(idx)
    if sms is None:
        sms = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return sms


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` (cached per device); ``""`` for a non-CUDA device. Launch
    tables keyed by GPU model (e.g. ``block_diagonal.scan._DIAG_BY_DEVICE``) read it per call."""
    if device.type != "cuda":
        return ""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    name = _NAMES.get(idx)
    if name is None:
        name = _NAMES[idx] = torch.cuda.get_device_name(idx)
    return name


def row_by_name(table: dict, name: str):
    """The value of the first key of ``table`` that is a substring of the GPU name ``name`` (so
    "NVIDIA GH200 ..." takes an "H200" row), or None. Launch tables keyed by GPU model use it."""
    return next((row for key, row in table.items() if key in name), None)


def band_choice(bands, per_sm: float, right_closed: bool = True):
    """The choice of the first band ``((lo, hi), choice)`` of ``bands`` that holds ``per_sm``
    (programs per SM), or None: ``lo < per_sm <= hi`` where ``right_closed`` (the wave-tail
    tables of ``device_band``), else ``lo <= per_sm < hi`` (the TMA tile tables, whose bands
    were measured from their lower edge up)."""
    if right_closed:
        return next((choice for (lo, hi), choice in bands if lo < per_sm <= hi), None)
    return next((choice for (lo, hi), choice in bands if lo <= per_sm < hi), None)


def device_band(table: dict, device, key, per_sm: float):
    """The launch choice of a wave-tail band table for ``device``, or None. ``table`` maps a GPU
    name substring (``row_by_name``) to ``{key: (((lo, hi), choice), ...)}``; the first band with
    ``lo < per_sm <= hi`` (programs per SM) gives ``choice``. None for a non-CUDA device, a GPU
    without a row, a row without ``key``, or ``per_sm`` outside every band."""
    if device is None or device.type != "cuda":
        return None
    return band_choice((row_by_name(table, device_name(device)) or {}).get(key, ()), per_sm)
