"""Naive reference for :func:`lrnn_scan.kernels.l2norm.l2_normalize` (torch, differentiable)."""
import torch
from torch import Tensor


def l2_normalize_ref(x: Tensor, eps: float = 1e-12) -> Tensor:
    """``x / max(‖x‖₂, eps)`` along the last dim, computed in float32 (float64 stays float64) and
    returned in ``x``'s dtype: ``torch.nn.functional.normalize`` semantics."""
    work = x if x.dtype == torch.float64 else x.float()
    return torch.nn.functional.normalize(work, dim=-1, eps=eps).to(x.dtype)
