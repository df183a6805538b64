"""Products of generalized Householder matrices (DeltaNet / DeltaProduct transitions).

``A = g (I - β_{n} k_{n} k_{n}^T) ⋯ (I - β_{1} k_{1} k_{1}^T)`` with unit keys ``k_j ∈ R^d``,
``β_j ∈ [0, 2]`` and a scalar gate ``g`` (1 when ungated). Factor 1 is applied first.

Facts (``shared/reference/math.md`` §8): each factor has eigenvalues ``{1 (×d−1), 1−β}`` and
spectral norm ≤ 1 for ``β ∈ [0, 2]``; ``β = 2`` is a reflection (negative eigenvalue −1).

Algebra: ``(g2 P2)(g1 P1) = (g1 g2) P2 P1`` is again a Householder product with the factors of
both (``n_1 + n_2`` keys), which :meth:`compose` uses while ``n_1 + n_2 ≤ d``; beyond that the
low-rank form costs more than a dense ``d x d`` block and the product is promoted to
:class:`BlockDiagonal`. The transpose reverses the order of the (symmetric) factors. Matrix
states ``(*batch, d_k, d_v)`` are the DeltaNet ``H_t`` with read-out ``o_t = H_t^T q_t``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import TransitionOperator, check_batch_tensor, check_same

__all__ = ["HouseholderProduct"]


class HouseholderProduct(TransitionOperator):
    """``g (I − β_n k_n k_n^T) ⋯ (I − β_1 k_1 k_1^T)``.

    Args:
        keys: ``(*batch_shape, n_h, d)`` keys, unit L2 norm (or pass ``normalize_keys=True``).
        beta: ``(*batch_shape, n_h)`` step sizes in ``[0, 2]``.
        gate: optional ``(*batch_shape,)`` scalar gate per step (default 1: ungated).
        normalize_keys: L2-normalise ``keys`` (differentiably) instead of requiring unit keys.
        check_values: verify unit keys and ``β ∈ [0, 2]`` (one device sync); raise ``ValueError``.

    Example:
        >>> k = torch.nn.functional.normalize(torch.randn(2, 6, 4, 2, 8), dim=-1)  # (B,T,H,n_h,d_k)
        >>> op = HouseholderProduct(k, torch.rand(2, 6, 4, 2) * 2)
        >>> op.apply(torch.randn(2, 6, 4, 8, 5)).shape                          # matrix state
        torch.Size([2, 6, 4, 8, 5])
    """

    tensor_fields = ("keys", "beta", "gate")

    def __init__(self, keys: Tensor, beta: Tensor, gate: Tensor | None = None, *,
                 normalize_keys: bool = False, check_values: bool = True):
        check_batch_tensor("keys", keys, 3, what=" (shape (*batch_shape, n_h, d))")
        check_batch_tensor("beta", beta, 2, what=" (shape (*batch_shape, n_h))")
        check_same("beta", beta, "keys", keys)
        if tuple(beta.shape) != tuple(keys.shape[:-1]):
            raise ValueError(f"beta must have shape keys.shape[:-1] = {tuple(keys.shape[:-1])} "
                             f"(*batch_shape, n_h); got {tuple(beta.shape)}")
        if keys.shape[-2] < 1:
            raise ValueError(f"keys: n_h (dim -2) must be >= 1, got shape {tuple(keys.shape)}")
        if gate is None:
            gate = torch.ones(keys.shape[:-2], dtype=keys.dtype, device=keys.device)
        else:
            check_batch_tensor("gate", gate, 1, what=" (shape (*batch_shape,))")
            check_same("gate", gate, "keys", keys)
            if tuple(gate.shape) != tuple(keys.shape[:-2]):
                raise ValueError(f"gate must have shape keys.shape[:-2] = {tuple(keys.shape[:-2])}"
                                 f" (*batch_shape,); got {tuple(gate.shape)}")
        if normalize_keys:
            keys = torch.nn.functional.normalize(keys, dim=-1)
        if check_values:
            tol = 1e-3 if keys.dtype in (torch.float16, torch.bfloat16) else 1e-5
            err = (keys.detach().float().norm(dim=-1) - 1).abs().max().item() if keys.numel() else 0
            if not err <= 10 * tol:
                raise ValueError(f"keys must have unit L2 norm along the last dim (max |‖k‖−1| "
                                 f"= {err:.3g}); pass normalize_keys=True to normalise them")
            if beta.numel():
                lo, hi = beta.detach().min().item(), beta.detach().max().item()
                if not (lo >= 0 and hi <= 2):
                    raise ValueError(f"beta must lie in [0, 2]; got values in [{lo:.4g}, {hi:.4g}]")
        self.keys, self.beta, self.gate = keys, beta, gate
        self._batch_ndim = keys.dim() - 2

    @property
    def state_size(self) -> int:
        return self.keys.shape[-1]

    @property
    def n_h(self) -> int:
        return self.keys.shape[-2]

    def _apply_matrix(self, x: Tensor) -> Tensor:
        for j in range(self.n_h):
            k = self.keys[..., j, :]                                   # (*b, d)
            kx = (k.unsqueeze(-1) * x).sum(-2, keepdim=True)           # (*b, 1, c)
            x = x - (self.beta[..., j, None, None] * k.unsqueeze(-1)) * kx
        return self.gate[..., None, None] * x

    def param_grads(self, x: Tensor, cotangent: Tensor):
        """Closed form of ``d<λ, A x>`` (no nested autograd, which torch 2.11's Dynamo cannot
        trace in the adjoint's backward). With ``x_0 = x``, ``x_j = P_j x_{j-1}``, ``s_j =
        k_j^T x_{j-1}``, ``μ_n = g λ``, ``u_j = k_j^T μ_j`` and ``μ_{j-1} = μ_j - β_j k_j u_j``:
        ``dg = <λ, x_n>``, ``dβ_j = -Σ_c u_jc s_jc``, ``dk_j = -β_j Σ_c (μ_j s_jc + x_{j-1} u_jc)``."""
        if x.dim() == self.keys.dim() - 1:   # vector states
            x, cotangent = x.unsqueeze(-1), cotangent.unsqueeze(-1)
        xs = [x]
        for j in range(self.n_h):
            k = self.keys[..., j, :].unsqueeze(-1)                       # (*b, d, 1)
            xs.append(xs[-1] - self.beta[..., j, None, None] * k * (k * xs[-1]).sum(-2, keepdim=True))
        dgate = (cotangent * xs[-1]).sum((-2, -1))
        mu = self.gate[..., None, None] * cotangent
        dkeys, dbeta = [None] * self.n_h, [None] * self.n_h
        for j in reversed(range(self.n_h)):
            k = self.keys[..., j, :].unsqueeze(-1)
            bj = self.beta[..., j, None, None]
            s = (k * xs[j]).sum(-2, keepdim=True)                        # (*b, 1, c)
            u = (k * mu).sum(-2, keepdim=True)
            dbeta[j] = -(u * s).sum((-2, -1))
            dkeys[j] = -(bj * (mu * s + xs[j] * u)).sum(-1)
            mu = mu - bj * k * u
        return (torch.stack(dkeys, -2).sum_to_size(self.keys.shape),
                torch.stack(dbeta, -1).sum_to_size(self.beta.shape), dgate.sum_to_size(self.gate.shape))

    def compose(self, earlier: TransitionOperator) -> TransitionOperator:
        if isinstance(earlier, HouseholderProduct) and self.n_h + earlier.n_h <= self.state_size:
            shape = torch.broadcast_shapes(self.gate.shape, earlier.gate.shape)
            k = torch.cat([earlier.keys.expand(*shape, *earlier.keys.shape[-2:]),
                           self.keys.expand(*shape, *self.keys.shape[-2:])], dim=-2)
            b = torch.cat([earlier.beta.expand(*shape, earlier.n_h),
                           self.beta.expand(*shape, self.n_h)], dim=-1)
            new = self.with_tensors(k, b, self.gate * earlier.gate)
            new._batch_ndim = len(shape)
            return new
        return super().compose(earlier)

    def transpose(self) -> "HouseholderProduct":
        return self.with_tensors(self.keys.flip(-2), self.beta.flip(-1), self.gate)

    def identity_like(self) -> "HouseholderProduct":
        return self.with_tensors(self.keys, torch.zeros_like(self.beta), torch.ones_like(self.gate))

    def to_dense(self) -> Tensor:
        d = self.state_size
        eye = torch.eye(d, dtype=self.keys.dtype, device=self.keys.device)
        return self.apply(eye.expand(*self.batch_shape, d, d))
