"""Python-side helpers shared by ``kernels.fused_gates`` and ``kernels.companion``:
argument checks with clear messages, ``cu_seqlens`` handling, launch heuristics."""
from __future__ import annotations

import os

import torch
from torch import Tensor

from .._host import next_pow2, num_sms  # noqa: F401  (re-exported for the launchers)

__all__ = ["check_float_tensor", "check_cu_seqlens", "check_state", "check_eps", "num_sms",
           "use_triton", "is_interpreted", "next_pow2", "FLOAT_DTYPES", "empty", "as_loaded"]

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_float_tensor(name: str, x, ndim: int, shape_doc: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got {tuple(x.shape)}")


def check_eps(eps) -> float:
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    return float(eps)


def check_cu_seqlens(cu_seqlens, batch: int, total: int, device) -> int:
    """Validate fla-style ``cu_seqlens``; return the number of sequences (``batch`` if None)."""
    if cu_seqlens is None:
        return batch
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"cu_seqlens must be int64 (or int32), got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must have shape (num_seqs + 1,), got {tuple(cu_seqlens.shape)}")
    if batch != 1:
        raise ValueError(f"cu_seqlens requires batch size 1 (sequences packed along time), got B={batch}")
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens must be on {device}, got {cu_seqlens.device}")
    if cu_seqlens.device.type == "cpu":  # cheap here; on CUDA this would synchronise
        c = cu_seqlens.tolist()
        if c[0] != 0 or c[-1] != total or any(b < a for a, b in zip(c, c[1:])):
            raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T={total}, got {c}")
    return cu_seqlens.numel() - 1


def check_state(name: str, x, shape: tuple, device) -> None:
    if x is None:
        return
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on {device}, got {x.device}")


def tune_knob(tune: dict, key: str, bwd: bool, default):
    """A launch setting from a ``TUNE`` dict: for the backward ``bwd_<key>`` first, then ``key``
    (both passes), else ``default``."""
    return tune.get("bwd_" + key, tune.get(key, default)) if bwd else tune.get(key, default)


def is_interpreted(kernel) -> bool:
    """Whether a ``@triton.jit`` kernel was built for the interpreter (``TRITON_INTERPRET=1`` at
    import time: Triton decides when the kernel is decorated, not when it is launched)."""
    return type(kernel).__name__ == "InterpretedFunction"


def use_triton(x: Tensor, kernel) -> bool:
    """Triton kernels run on CUDA tensors, and on CPU tensors when built for the interpreter."""
    return x.is_cuda or is_interpreted(kernel)


def empty(shape, dtype, device) -> Tensor:
    """``torch.empty``, or NaN-filled under ``LRNN_SCAN_POISON=1`` (tests: every output written)."""
    if os.environ.get("LRNN_SCAN_POISON", "0") not in ("", "0"):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def as_loaded(x: Tensor, upcast16: bool = True) -> Tensor:
    """The tensor a scan kernel reads: 16-bit inputs as an fp32 copy when ``upcast16``.

    These kernels load a few scattered elements per thread and step; Triton software-pipelines
    such loads as async copies, which move 4, 8 or 16 bytes, so 2-byte loads stay unpipelined
    and every step of the sequential recurrence waits for its loads. One extra elementwise pass
    costs less (measured in ``benchmarks/RESULTS.md``). Stores are not pipelined and stay 16-bit."""
    return x.float() if upcast16 and x.element_size() < 4 else x
