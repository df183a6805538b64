"""Block-diagonal transitions (BD-LRU): one dense ``m x m`` block per group.

Algebra: blocks multiply independently (``A2 A1`` is a batched ``m x m`` matmul, closed),
transpose is the per-block transpose, identity the per-block ``I_m``. A scan step costs
``2 m^2`` flops per block; a combine of two steps ``2 m^3``. Dense ``d x d`` operators of any
other family promote to this one (``m = d``), which makes it the common target of mixed
compositions.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import TransitionOperator, check_batch_tensor

__all__ = ["BlockDiagonal"]


class BlockDiagonal(TransitionOperator):
    """Dense blocks: ``h_t = A_t h_{t-1} + b_t`` per block.

    Args:
        A: ``(*batch_shape, m, m)`` blocks, any ``m >= 1``; ``batch_shape`` is everything before
            the last two dims, e.g. ``(B, T, H)`` for ``H`` blocks of a BD-LRU layer with
            ``N = H m`` state units. States are ``(*batch_shape, m)`` or ``(*batch_shape, m, c)``.

    Example:
        >>> A = torch.randn(2, 7, 3, 4, 4) / 4           # (B, T, H, m, m)
        >>> BlockDiagonal(A).state_size
        4
    """

    tensor_fields = ("A",)

    def __init__(self, A: Tensor):
        check_batch_tensor("A", A, 3, what=" (blocks, shape (*batch_shape, m, m))")
        if A.shape[-1] != A.shape[-2]:
            raise ValueError(f"A must hold square blocks (*batch_shape, m, m); got shape "
                             f"{tuple(A.shape)} (last two dims {A.shape[-2]} != {A.shape[-1]})")
        if A.shape[-1] < 1:
            raise ValueError(f"A: block size m must be >= 1, got shape {tuple(A.shape)}")
        self.A = A
        self._batch_ndim = A.dim() - 2

    @classmethod
    def _from_dense(cls, A: Tensor, batch_ndim: int) -> "BlockDiagonal":
        new = object.__new__(cls)
        new.A = A
        new._batch_ndim = batch_ndim
        return new

    @property
    def state_size(self) -> int:
        return self.A.shape[-1]

    def _apply_matrix(self, x: Tensor) -> Tensor:
        return self.A @ x

    def compose(self, earlier: TransitionOperator) -> TransitionOperator:
        if isinstance(earlier, BlockDiagonal):
            return self.with_tensors(self.A @ earlier.A)
        return super().compose(earlier)

    def transpose(self) -> "BlockDiagonal":
        return self.with_tensors(self.A.mT)

    def identity_like(self) -> "BlockDiagonal":
        eye = torch.eye(self.state_size, dtype=self.A.dtype, device=self.A.device)
        return self.with_tensors(eye.expand_as(self.A).contiguous())

    def to_dense(self) -> Tensor:
        return self.A

    def param_grads(self, x: Tensor, cotangent: Tensor):
        if x.dim() == self.A.dim() - 1:
            g = cotangent.unsqueeze(-1) * x.unsqueeze(-2)
        else:
            g = cotangent @ x.mT
        return (g.sum_to_size(self.A.shape),)
