"""Autograd for the torch scans through the adjoint (reverse) scan — math.md §4.

With ``g_t = ∂L/∂h_t``:  ``λ_T = g_T``,  ``λ_t = g_t + A_{t+1}^T λ_{t+1}`` — itself a linear scan,
run backwards in time over the *transposed* operators shifted by one step. Then

* ``∂L/∂b_t = λ_t``,
* ``∂L/∂h_0 = A_1^T λ_1``,
* ``∂L/∂θ`` for the operator's parameters θ is the vector-Jacobian product of
  ``θ ↦ A_t(θ) h_{t-1}`` with ``λ_t`` — for dense blocks ``λ_t h_{t-1}^T`` — computed for all ``t``
  at once by :meth:`TransitionOperator.param_grads`.

So any operator that implements the protocol gets exact gradients, at the cost of one more scan,
and the Blelloch tree is never differentiated (its memory would be ``O(T log T)`` states).
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .operators.base import TransitionOperator
from .scans import blelloch_scan, sequential_scan

__all__ = ["scan_with_adjoint", "SCAN_ALGORITHMS"]

SCAN_ALGORITHMS = {"sequential": sequential_scan, "blelloch": blelloch_scan}


def _shift_next(t: Tensor, dim: int) -> Tensor:
    """``t[1:]`` along ``dim`` with the last step repeated (it only ever multiplies a zero)."""
    T = t.shape[dim]
    return torch.cat([t.narrow(dim, 1, T - 1), t.narrow(dim, T - 1, 1)], dim=dim)


class _AdjointScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, template: TransitionOperator, dim: int, method: str, b: Tensor,
                h0: Tensor | None, *params: Tensor) -> Tensor:
        op = template.with_tensors(*params)
        algo = SCAN_ALGORITHMS[method]
        h = algo(op, b, h0, dim)
        ctx.template, ctx.dim, ctx.algo = template, dim, algo
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(h, *(() if h0 is None else (h0,)), *params)
        return h

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h: Tensor):
        dim, algo = ctx.dim, ctx.algo
        saved = ctx.saved_tensors
        h = saved[0]
        h0 = saved[1] if ctx.has_h0 else None
        params = saved[2:] if ctx.has_h0 else saved[1:]
        op = ctx.template.with_tensors(*params)
        op_t = op.transpose()
        # λ_t = g_t + A_{t+1}^T λ_{t+1}: a forward scan over the time-reversed, shifted operators.
        shifted = op_t.map(lambda t: _shift_next(t, dim).flip(dim))
        lam = algo(shifted, grad_h.flip(dim), None, dim).flip(dim)
        first = h.narrow(dim, 0, 1)
        prev0 = torch.zeros_like(first) if h0 is None else h0.unsqueeze(dim)
        h_prev = torch.cat([prev0, h.narrow(dim, 0, h.shape[dim] - 1)], dim=dim)
        needs = ctx.needs_input_grad
        dparams = op.param_grads(h_prev, lam) if any(needs[5:]) else (None,) * len(params)
        dh0 = None
        if h0 is not None and needs[4]:
            dh0 = op_t.select_time(dim, 0).apply(lam.narrow(dim, 0, 1)).squeeze(dim)
        db = lam if needs[3] else None
        return (None, None, None, db, dh0, *dparams)


def scan_with_adjoint(op: TransitionOperator, b: Tensor, h0: Tensor | None, dim: int,
                      method: str) -> Tensor:
    """All states of the scan with ``method`` ('sequential' | 'blelloch'), differentiable
    w.r.t. ``b``, ``h0`` and every tensor of ``op`` through the adjoint scan."""
    if not (torch.is_grad_enabled() and (b.requires_grad or (h0 is not None and h0.requires_grad)
                                         or any(t.requires_grad for t in op.tensors()))):
        return SCAN_ALGORITHMS[method](op, b, h0, dim)
    return _AdjointScan.apply(op, dim, method, b, h0, *op.tensors())
