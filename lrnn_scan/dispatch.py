"""Routing ``scan(..., method="auto"|"kernel")`` to the Triton kernels of ``lrnn_scan.kernels``.

A kernel is used when the tensors are on CUDA and the operator/layout is one a kernel implements:

==================  ====================  ==========================================
operator            layout                kernel
==================  ====================  ==========================================
``Diagonal``        a, b ``(B, T, N)``     ``kernels.block_diagonal.diagonal_scan``
``BlockDiagonal``   A ``(B, T, H, m, m)``  ``kernels.block_diagonal.block_diagonal_scan``
                    b ``(B, T, H, m)``,
                    m ≤ 32
``Companion``       a ``(B, T, N, m)``,    ``kernels.companion.companion_scan_coeffs``
                    b ``(B, T, N)``
``Diagonal``,       a, b ``(*L, T, 1)``,   ``kernels.block_diagonal.diagonal_scan``
state size 1        time the last batch    with ``time_dim=2`` on ``(1, prod(L), T)``
                    dim (contiguous)       (``(B, T, 1)``: from ``TIME_MAJOR_MIN_ROWS``
                                           rows, without ``cu_seqlens``)
==================  ====================  ==========================================

Vector states only, time at dim 1 (or last, as above). Anything else falls back to the torch
scans (or, with ``method="kernel"``, raises a ``ValueError`` saying why no kernel fits). Imports
are lazy: importing ``lrnn_scan`` never imports Triton.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _kernel_modules as _km
from ._kernel_modules import kernel_module
from .operators import BlockDiagonal, Companion, Diagonal, TransitionOperator

__all__ = ["try_kernel_scan", "kernel_for"]

MAX_KERNEL_BLOCK = 32
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (B, T, 1) Diagonal scans with at least this many rows take the time-major kernel: about one row
# per SM of an H100 / H200 (132). Below it the (B, T, N) kernels split time (a choice, not timed;
# a constant, not a device query, so that Dynamo traces it)
TIME_MAJOR_MIN_ROWS = 128


def kernel_for(op: TransitionOperator, b: Tensor, dim: int, reverse: bool,
               cu_seqlens) -> tuple[str | None, str]:
    """``(qualified kernel name, "")`` if a kernel fits, else ``(None, reason)``."""
    if not _km.kernel_device(op.device):
        return None, f"tensors are on {op.device}, the Triton kernels need CUDA"
    if op.dtype not in KERNEL_DTYPES:
        return None, f"kernels take float16/bfloat16/float32, got {op.dtype}"
    if _time_last(op, b, dim, cu_seqlens):
        if cu_seqlens is not None:
            return None, "the time-contiguous diagonal kernel (time the last batch dim) takes no cu_seqlens"
        return _TIME_LAST, ""
    if dim != 1:
        return None, (f"kernels need time at dim 1 (or, for a Diagonal operator with state size 1, "
                      f"time as the last batch dim), got dim={dim}")
    if reverse and cu_seqlens is not None:
        return None, "reverse=True with cu_seqlens has no kernel"
    if type(op) is Diagonal and op.batch_ndim == 2 and b.dim() == 3:
        return "block_diagonal.diagonal_scan", ""
    if type(op) is BlockDiagonal and op.batch_ndim == 3 and b.dim() == 4:
        if op.state_size > MAX_KERNEL_BLOCK:
            return None, f"block size m={op.state_size} > {MAX_KERNEL_BLOCK}"
        return "block_diagonal.block_diagonal_scan", ""
    if type(op) is Companion and not op.transposed and op.batch_ndim == 3 \
            and tuple(b.shape) == tuple(op.batch_shape):
        return "companion.companion_scan_coeffs", ""
    return None, (f"no kernel for {type(op).__name__} with batch_shape={tuple(op.batch_shape)} and "
                  f"b.shape={tuple(b.shape)} (see lrnn_scan.dispatch)")


_TIME_LAST = "block_diagonal.diagonal_scan#time_last"


def _time_last(op, b, dim, cu_seqlens) -> bool:
    """A ``Diagonal`` with state size 1 whose time is the last batch dim: ``(*lead, T, 1)``, each
    row of ``lead`` a scalar recurrence with time contiguous (the ``time_dim=2`` kernels, whose
    only parallelism is the rows). ``(B, T, 1)`` (time at dim 1) can also take the ``(B, T, N)``
    kernels, which split time when ``B`` is small and take ``cu_seqlens``: it goes time-major only
    without offsets and with ``TIME_MAJOR_MIN_ROWS`` rows or more."""
    if not (type(op) is Diagonal and op.state_size == 1 and b.dim() == op.batch_ndim + 1
            and op.batch_ndim >= 2 and dim == op.batch_ndim - 1):
        return False
    return dim != 1 or (cu_seqlens is None and b.shape[0] >= TIME_MAJOR_MIN_ROWS)


def _scan_time_last(fn, a, b, h0, output_final_state, reverse):
    """``(*lead, T, 1)`` as ``(1, prod(lead), T)`` for ``fn = diagonal_scan(..., time_dim=2)``."""
    lead, T = b.shape[:-2], b.shape[-2]
    a3, b3 = a.reshape(1, math.prod(lead), T), b.reshape(1, math.prod(lead), T)
    if reverse:
        a3, b3 = a3.flip(-1), b3.flip(-1)
    h, hf = fn(a3.contiguous(), b3.contiguous(), initial_state=None if h0 is None else h0.reshape(1, -1),
               output_final_state=output_final_state, time_dim=2)
    h = h.flip(-1) if reverse else h
    return h.reshape(b.shape), (None if hf is None else hf.reshape(*lead, 1))


def try_kernel_scan(op: TransitionOperator, b: Tensor, initial_state, output_final_state: bool,
                    reverse: bool, cu_seqlens, dim: int, required: bool):
    """Run the matching kernel and return ``(h, h_final)``, or ``None`` to fall back."""
    name, why = kernel_for(op, b, dim, reverse, cu_seqlens)
    if name is None:
        if required:
            raise ValueError(f"method='kernel': {why}")
        return None
    module, fn_name = name.split("#")[0].rsplit(".", 1)
    try:
        fn = getattr(kernel_module(module), fn_name)
    except (ImportError, AttributeError) as exc:
        if required:
            raise ValueError(f"method='kernel': lrnn_scan.kernels.{name} is unavailable ({exc})") \
                from exc
        return None
    (param,) = op.tensors()
    # Kernels index dense row-major memory; strided views (e.g. a[..., 0]) are copied once here.
    param, b = param.contiguous(), b.contiguous()
    h0 = None if initial_state is None else initial_state.float().contiguous()
    if name == _TIME_LAST:
        return _scan_time_last(fn, param, b, h0, output_final_state, reverse)
    if reverse:
        param, b = param.flip(1), b.flip(1)
    h, h_final = fn(param, b, initial_state=h0, output_final_state=output_final_state,
                    cu_seqlens=cu_seqlens)
    if reverse:
        h = h.flip(1)
    return h, h_final
