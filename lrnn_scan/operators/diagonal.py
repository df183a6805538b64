"""Diagonal transitions: ``A = diag(a)``.

Algebra: ``diag(a2) diag(a1) = diag(a2 * a1)`` (closed, commutative), ``diag(a)^T = diag(a)``,
identity ``a = 1``. A scan step costs ``d`` multiplies. ``Diagonal`` with ``a`` of shape
``(B, T, N)`` is the diagonal LRU (m = 1); with ``a`` of shape ``(B, T, H, d_k)`` it is a per-key
decay on a ``(d_k, d_v)`` matrix state (GLA-style) and composes with :class:`HouseholderProduct`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import TransitionOperator, check_batch_tensor

__all__ = ["Diagonal"]


class Diagonal(TransitionOperator):
    """Diagonal transition ``h_t = a_t ⊙ h_{t-1} + b_t``.

    Args:
        a: ``(*batch_shape, d)`` diagonal entries, real floating dtype. ``batch_shape`` is
            everything but the last dim, e.g. ``(B, T)`` for a ``(B, T, N)`` diagonal LRU.

    Example:
        >>> a = torch.rand(2, 5, 8)                      # (B, T, N)
        >>> Diagonal(a).apply(torch.ones(2, 5, 8)).shape
        torch.Size([2, 5, 8])
    """

    tensor_fields = ("a",)

    def __init__(self, a: Tensor):
        check_batch_tensor("a", a, 2, what=" (Diagonal entries, shape (*batch_shape, d))")
        self.a = a
        self._batch_ndim = a.dim() - 1

    @property
    def state_size(self) -> int:
        return self.a.shape[-1]

    def _apply_matrix(self, x: Tensor) -> Tensor:
        return self.a.unsqueeze(-1) * x

    def compose(self, earlier: TransitionOperator) -> TransitionOperator:
        if isinstance(earlier, Diagonal):
            return self.with_tensors(self.a * earlier.a)
        return super().compose(earlier)

    def transpose(self) -> "Diagonal":
        return self

    def identity_like(self) -> "Diagonal":
        return self.with_tensors(torch.ones_like(self.a))

    def to_dense(self) -> Tensor:
        return torch.diag_embed(self.a)

    def param_grads(self, x: Tensor, cotangent: Tensor):
        g = cotangent * x
        if g.dim() == self.a.dim() + 1:
            g = g.sum(-1)
        return (g.sum_to_size(self.a.shape),)
