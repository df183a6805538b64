"""Companion transitions (H-LRU of order ``m``): ``h_t = Σ_{i=1..m} a_{i,t} h_{t-i} + b_t``.

As a first-order system the state is the shift register ``s_t = (h_t, h_{t-1}, …, h_{t-m+1})``
and the transition is the companion matrix ``C = [[a_1 … a_m], [I_{m-1} 0]]``. Applying ``C`` (or
``C^T``) costs ``O(m)``: ``(C s)_0 = a·s``, ``(C s)_i = s_{i-1}``; ``(C^T y)_j = a_j y_0 + y_{j+1}``.

Algebra: the product of two companions is a *dense* ``m x m`` block, so :meth:`compose` promotes to
:class:`BlockDiagonal`; the transpose is kept structured (``transposed=True``); the identity is a
dense identity block. The scan input of an H-LRU channel only enters the newest component, so
:func:`lrnn_scan.scan` also accepts ``b`` of shape ``batch_shape`` (no trailing ``m``) for a
``Companion`` and then returns the newest component only.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import TransitionOperator, check_batch_tensor

__all__ = ["Companion"]


class Companion(TransitionOperator):
    """H-LRU companion transition of order ``m``.

    Args:
        a: ``(*batch_shape, m)`` recurrence coefficients; ``a[..., i]`` multiplies ``h_{t-1-i}``
            (so ``a[..., 0]`` weights the newest state). ``batch_shape`` is e.g. ``(B, T, N)``
            for ``N`` channels. States are ``(*batch_shape, m)`` shift registers, newest first.
        transposed: represent ``C^T`` instead of ``C`` (used by the adjoint scan).

    Example:
        >>> a = torch.rand(2, 9, 16, 3) / 3              # (B, T, N, m)
        >>> Companion(a).to_dense().shape
        torch.Size([2, 9, 16, 3, 3])
    """

    tensor_fields = ("a",)
    config_fields = ("transposed",)

    def __init__(self, a: Tensor, transposed: bool = False):
        check_batch_tensor("a", a, 2, what=" (companion coefficients, shape (*batch_shape, m))")
        if a.shape[-1] < 1:
            raise ValueError(f"a: order m must be >= 1, got shape {tuple(a.shape)}")
        self.a = a
        self.transposed = bool(transposed)
        self._batch_ndim = a.dim() - 1

    @property
    def state_size(self) -> int:
        return self.a.shape[-1]

    def _apply_matrix(self, x: Tensor) -> Tensor:
        a = self.a.unsqueeze(-1)
        if not self.transposed:
            newest = (a * x).sum(-2, keepdim=True)
            return torch.cat([newest, x[..., :-1, :]], dim=-2)
        shifted = torch.cat([x[..., 1:, :], torch.zeros_like(x[..., :1, :])], dim=-2)
        return a * x[..., :1, :] + shifted

    def transpose(self) -> "Companion":
        new = self.with_tensors(self.a)
        new.transposed = not self.transposed
        return new

    def identity_like(self) -> TransitionOperator:
        from .block_diagonal import BlockDiagonal

        eye = torch.eye(self.state_size, dtype=self.a.dtype, device=self.a.device)
        return BlockDiagonal._from_dense(eye.expand(*self.a.shape, self.state_size).contiguous(),
                                         self._batch_ndim)

    def param_grads(self, x: Tensor, cotangent: Tensor):
        """Closed form (no nested autograd, which torch 2.11's Dynamo cannot trace in the
        adjoint's backward): ``d<λ, C x>/da_i = Σ_c λ_0c x_ic``; for ``C^T``, ``Σ_c λ_ic x_0c``."""
        if x.dim() == self.a.dim():   # vector states
            x, cotangent = x.unsqueeze(-1), cotangent.unsqueeze(-1)
        g = (cotangent * x[..., :1, :] if self.transposed else x * cotangent[..., :1, :]).sum(-1)
        return (g.sum_to_size(self.a.shape),)

    def to_dense(self) -> Tensor:
        m = self.state_size
        shift = torch.eye(m - 1, m, dtype=self.a.dtype, device=self.a.device)
        shift = shift.expand(*self.a.shape[:-1], m - 1, m)
        C = torch.cat([self.a.unsqueeze(-2), shift], dim=-2)
        return C.mT if self.transposed else C
