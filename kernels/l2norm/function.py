"""Autograd Function and launcher of the row-wise L2 normalisation."""
from __future__ import annotations

import torch
from torch import Tensor

from .._host import cdiv, next_pow2
from ..fused_gates._common import empty, use_triton
from .kernel import l2norm_bwd_kernel, l2norm_fwd_kernel
from .ref import l2_normalize_ref

MAX_K = 1024  # one row per register tile; longer rows take the torch path


def _cfg(K: int) -> tuple[int, int, int]:
    """(BK, BR, num_warps): about 2048 elements per program (16 rows of 128 for q/k heads), 16
    per thread: with 4096 the backward used all 255 registers and spilled at K = 64 (sm_90,
    Triton 3.6, ptxas -v: every element carries a 64-bit address)."""
    BK = next_pow2(K)
    BR = max(1, min(64, 2048 // BK))
    return BK, BR, 4 if BK * BR >= 2048 else 2


def _launch_fwd(x2: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    R, K = x2.shape
    y = empty((R, K), x2.dtype, x2.device)
    rstd = empty((R,), torch.float32, x2.device)
    BK, BR, nw = _cfg(K)
    if R:
        l2norm_fwd_kernel[(cdiv(R, BR),)](x2, y, rstd, R, K, eps, BR=BR, BK=BK, num_warps=nw)
    return y, rstd


def _launch_bwd(x2: Tensor, rstd: Tensor, dy2: Tensor, eps: float) -> Tensor:
    R, K = x2.shape
    dx = empty((R, K), x2.dtype, x2.device)
    BK, BR, nw = _cfg(K)
    if R:
        l2norm_bwd_kernel[(cdiv(R, BR),)](x2, rstd, dy2, dx, R, K, eps, BR=BR, BK=BK,
                                                 num_warps=nw)
    return dx


class _L2NormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, eps: float):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y, rstd = _launch_fwd(x2, eps)
        ctx.save_for_backward(x2, rstd)
        ctx.eps = eps
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x2, rstd = ctx.saved_tensors
        dx = _launch_bwd(x2, rstd, dy.reshape(x2.shape).contiguous(), ctx.eps)
        return dx.view(dy.shape), None


def l2_normalize(x: Tensor, eps: float = 1e-12) -> Tensor:
    """``x / max(‖x‖₂, eps)`` along the last dim, in ``x``'s dtype (sums in float32).

    Args:
        x: ``(*, K)``, float32/bfloat16/float16 (float64 and ``K > 1024`` take the torch path).
        eps: lower bound of the norm (``torch.nn.functional.normalize``'s default).

    Returns:
        ``(*, K)`` like ``x``; differentiable. Triton on CUDA (and under ``TRITON_INTERPRET=1``),
        :func:`l2_normalize_ref` elsewhere. Unlike ``F.normalize`` under autocast, the output
        keeps ``x``'s 16-bit dtype, which is what the delta kernels want for their dots.

    Example:
        >>> q = l2_normalize(torch.randn(2, 16, 4, 128))     # (B, T, H, K), rows of unit norm
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dim (the normalised one)")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    eps = float(eps)
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    K = x.shape[-1]
    if (x.dtype == torch.float64 or K == 0 or K > MAX_K or not use_triton(x, l2norm_fwd_kernel)):
        return l2_normalize_ref(x, eps)
    return _L2NormFn.apply(x, eps)
