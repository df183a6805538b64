"""Scans straight from gate logits: the BD-LRU and H-LRU recurrences of the paper.

On CUDA these call the fused Triton kernels (the gate normalisation happens in registers and the
transition matrices never exist in memory); elsewhere they normalise with
:func:`lrnn_scan.gates.normalize_gates` and call :func:`lrnn_scan.scan`. Both paths have the same
semantics, which the kernel tests check.
"""
from __future__ import annotations


import torch
from torch import Tensor

from . import _kernel_modules as _km
from ._kernel_modules import kernel_module
from .api import scan
from .gates import DEFAULT_EPS, canonical_gate_name, normalize_gates
from .operators import BlockDiagonal, Companion

__all__ = ["bdlru_scan", "hlru_scan", "GATED_METHODS"]

# ``unfused``: normalise with torch, then ``scan(..., method="auto")`` (the block-diagonal or
# companion-coefficient kernels on CUDA): ``A`` is materialised, but those scans split time into
# chunks when there are few sequences. The fused kernels chunk time too (``chunked.py`` of
# ``fused_gates`` and ``companion``, m = 2..16 / 2..8), so ``bdlru_scan``'s ``auto`` takes the
# unfused path only where it still wins (``fused_gates.unfused_faster``: m = 16 / 32, long
# forwards at m = 4 / 8); ``hlru_scan``'s ``auto`` stays fused (its unfused path runs the same
# chunked companion kernels after materialising the coefficients).
GATED_METHODS = ("auto", "kernel", "unfused", "blelloch", "sequential")


def _check(name: str, t, rank: int, layout: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have shape {layout}; got {tuple(t.shape)}")


def _fused(module: str, fn: str, method: str, logits: Tensor):
    """The fused kernel for CUDA float16/bfloat16/float32 logits, else ``None`` (torch path)."""
    if method not in GATED_METHODS:
        raise ValueError(f"method must be one of {GATED_METHODS}, got {method!r}")
    reason = None
    if not _km.kernel_device(logits.device):
        reason = f"method='kernel' needs CUDA tensors, got {logits.device}"
    elif logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        reason = f"method='kernel' takes float16/bfloat16/float32 logits, got {logits.dtype}"
    if method not in ("auto", "kernel") or reason is not None:
        if method == "kernel":
            raise ValueError(reason)
        return None
    try:
        return getattr(kernel_module(module), fn)
    except (ImportError, AttributeError) as exc:
        if method == "kernel":
            raise ValueError(f"method='kernel': lrnn_scan.kernels.{module}.{fn} unavailable "
                             f"({exc})") from exc
        return None


def _backward_follows(*tensors) -> bool:
    """Whether autograd will record this call: grad mode on and an input that requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def bdlru_scan(logits: Tensor, v: Tensor, gate: str = "softmax", *, eps: float = DEFAULT_EPS,
               initial_state: Tensor | None = None, output_final_state: bool = False,
               cu_seqlens: Tensor | None = None, method: str = "auto"):
    """BD-LRU: ``h_t = A_t h_{t-1} + a0_t ⊙ v_t`` per block, ``(A_t, a0_t)`` from the logits.

    Args:
        logits: ``(B, T, H, m, m + 1)`` raw gates; row ``i`` of block ``k`` holds the input-gate
            logit at index 0 and the ``m`` transition-entry logits at ``1..m``
            (see :func:`lrnn_scan.gates.normalize_gates`).
        v: ``(B, T, H, m)`` values.
        gate: gate variant of :mod:`lrnn_scan.gates` (``softmax`` default).
        initial_state: ``(B, H, m)`` (``(num_seqs, H, m)`` with ``cu_seqlens``).
        method: ``auto`` (fused kernel on CUDA, time-chunked for a few long sequences at
            m = 2..16: ``lrnn_scan.kernels.fused_gates.function.choose_chunk``; eager fp32
            calls without ``cu_seqlens`` take ``unfused`` for a few long sequences at m = 32
            (and m = 16 below the chunk rule's length) and for long forwards without gradients
            at m = 3..32, where that was measured faster, at the cost of ``A`` (and its
            gradient) in memory, each about the size of ``logits``:
            ``lrnn_scan.kernels.fused_gates.unfused_faster``)
            | ``kernel`` (fused kernel, or an error) | ``unfused`` (``A`` materialised by
            :func:`lrnn_scan.gates.normalize_gates`, then :func:`lrnn_scan.scan` with
            ``method="auto"``: the block-diagonal kernels on CUDA) | ``blelloch`` | ``sequential``.

    Returns:
        ``h`` ``(B, T, H, m)``, or ``(h, h_final)`` with ``output_final_state``.
    """
    _check("logits", logits, 5, "(B, T, H, m, m + 1)")
    _check("v", v, 4, "(B, T, H, m)")
    m = logits.shape[-2]
    if logits.shape[-1] != m + 1:
        raise ValueError(f"logits must have shape (B, T, H, m, m + 1); got {tuple(logits.shape)} "
                         f"(last dim {logits.shape[-1]} != m + 1 = {m + 1})")
    if tuple(v.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"v must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])} "
                         f"(B, T, H, m); got {tuple(v.shape)}")
    gate = canonical_gate_name(gate)
    fn = _fused("fused_gates", "fused_gate_scan", method, logits)
    if (fn is not None and method == "auto" and cu_seqlens is None and logits.dtype == torch.float32
            and not torch.compiler.is_compiling()
            and kernel_module("fused_gates").unfused_faster(
                *logits.shape[:3], m, logits.device,
                backward=_backward_follows(logits, v, initial_state))):
        # few long sequences at m = 32 (m = 16 short of chunking), long forwards at m >= 3: the
        # block-diagonal scan's look-backs are faster (measured in fp32; in 16 bits the unfused
        # path would round A, which the fused kernel never stores)
        fn = None
    if fn is not None:
        h, hT = fn(logits.contiguous(), v.contiguous(), variant=gate, eps=eps,
                   initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        return (h, hT) if output_final_state else h
    A, a0 = normalize_gates(logits, gate, eps)
    return scan(BlockDiagonal(A), a0 * v.to(a0.dtype), initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                method="auto" if method in ("kernel", "unfused") else method)


def hlru_scan(logits: Tensor, v: Tensor, gate: str = "softmax", *, eps: float = DEFAULT_EPS,
              initial_state: Tensor | None = None, output_final_state: bool = False,
              cu_seqlens: Tensor | None = None, method: str = "auto"):
    """H-LRU of order ``m``: ``h_t = Σ_{i=1..m} a_{i,t} h_{t-i} + a0_t v_t`` per channel.

    Args:
        logits: ``(B, T, N, m + 1)``; index 0 is the input gate, ``1..m`` weight
            ``h_{t-1} … h_{t-m}``; normalised row-wise by ``gate``.
        v: ``(B, T, N)`` values.
        initial_state: ``(B, N, m)`` shift registers ``(h_0, h_{-1}, …)``, newest first.
        method: ``auto`` (fused kernel on CUDA; a few long fixed-length sequences at m = 2..8
            split time into chunks: ``lrnn_scan.kernels.companion.function.choose_chunk``) |
            ``kernel`` (fused kernel, or an error) | ``unfused`` (the coefficients materialised
            by :func:`lrnn_scan.gates.normalize_gates`, then :func:`lrnn_scan.scan` with
            ``method="auto"``) | ``blelloch`` | ``sequential``.

    Returns:
        ``h`` ``(B, T, N)`` (the newest component), or ``(h, h_final)`` with ``h_final``
        ``(B | num_seqs, N, m)``.
    """
    _check("logits", logits, 4, "(B, T, N, m + 1)")
    _check("v", v, 3, "(B, T, N)")
    if logits.shape[-1] < 2:
        raise ValueError(f"logits must have shape (B, T, N, m + 1) with m >= 1; got "
                         f"{tuple(logits.shape)}")
    if tuple(v.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"v must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])} "
                         f"(B, T, N); got {tuple(v.shape)}")
    gate = canonical_gate_name(gate)
    fn = _fused("companion", "companion_scan", method, logits)
    if fn is not None:
        h, hT = fn(logits.contiguous(), v.contiguous(), variant=gate, eps=eps,
                   initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        return (h, hT) if output_final_state else h
    a, a0 = normalize_gates(logits, gate, eps)
    return scan(Companion(a), a0 * v.to(a0.dtype), initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                method="auto" if method in ("kernel", "unfused") else method)
