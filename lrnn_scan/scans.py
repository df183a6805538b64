"""The two torch scan algorithms over any :class:`~lrnn_scan.operators.TransitionOperator`.

Both compute every state of ``h_t = A_t h_{t-1} + b_t`` along batch dim ``dim`` (time) and are
not differentiable by themselves: :mod:`lrnn_scan.adjoint` wraps them in an autograd Function
whose backward is the adjoint scan (math.md §4), never a differentiation through the tree.

* :func:`sequential_scan` — the reference: a plain loop over time, ``T`` operator applications.
* :func:`blelloch_scan` — work-efficient: an up-sweep that pairs neighbours level by level
  (``T/2 + T/4 + … < T`` combines, each level one batched tensor op) and a down-sweep that fills in
  the even positions with one batched ``apply`` per level. Depth ``O(log T)``; any ``T`` (an odd
  element at the end of a level is carried to the down-sweep, no padding). Only the *operator*
  part of the up-sweep needs compositions; the down-sweep only applies operators to states, so a
  dense family pays ``m^3`` for ``< T`` combines and ``m^2`` for the rest.

The initial state is folded into the first input (``b_1 ← b_1 + A_1 h_0``), so neither algorithm
ever needs the prefix *operators*, only the prefix states.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .operators.base import TransitionOperator, compose

__all__ = ["sequential_scan", "blelloch_scan", "fold_initial_state"]


def _sl(dim: int, s: slice) -> tuple:
    return (slice(None),) * dim + (s,)


def fold_initial_state(op: TransitionOperator, b: Tensor, h0: Tensor | None, dim: int) -> Tensor:
    """``b`` with ``A_1 h_0`` added to its first time step (a new tensor; ``b`` is untouched)."""
    if h0 is None:
        return b
    first = op.select_time(dim, 0).apply(h0.unsqueeze(dim)) + b.narrow(dim, 0, 1)
    return torch.cat([first, b.narrow(dim, 1, b.shape[dim] - 1)], dim=dim)


def sequential_scan(op: TransitionOperator, b: Tensor, h0: Tensor | None = None,
                    dim: int = 1) -> Tensor:
    """All states by a loop over time: ``h_t = op[t].apply(h_{t-1}) + b[t]``.

    Args:
        op: operator with ``batch_shape == b.shape[:op.batch_ndim]``; time is batch dim ``dim``.
        b: ``(*batch_shape, d)`` or ``(*batch_shape, d, c)``.
        h0: initial state, ``b``'s shape without dim ``dim``; ``None`` means zeros.
    """
    T = b.shape[dim]
    h = None if h0 is None else h0.unsqueeze(dim)
    outs = []
    for t in range(T):
        bt = b.narrow(dim, t, 1)
        h = bt if h is None else op.select_time(dim, t).apply(h) + bt
        outs.append(h)
    if not outs:
        return b.clone()
    return torch.cat(outs, dim=dim)


def blelloch_scan(op: TransitionOperator, b: Tensor, h0: Tensor | None = None,
                  dim: int = 1) -> Tensor:
    """All states by a work-efficient up-sweep / down-sweep scan (same contract as
    :func:`sequential_scan`)."""
    b = fold_initial_state(op, b, h0, dim)
    levels = []                       # (operators, inputs, length) of each level of the up-sweep
    cur_op, cur_b = op, b
    n = b.shape[dim]
    while n > 1:
        half = n // 2
        left, right = _sl(dim, slice(0, 2 * half, 2)), _sl(dim, slice(1, 2 * half, 2))
        op_r = cur_op.select_time(dim, slice(1, 2 * half, 2))
        new_b = op_r.apply(cur_b[left]) + cur_b[right]
        levels.append((cur_op, cur_b, n))
        # The top level's operator is never used by the down-sweep: skip that composition.
        cur_op = compose(op_r, cur_op.select_time(dim, slice(0, 2 * half, 2))) if half > 1 else None
        cur_b, n = new_b, half
    prefix = cur_b                    # inclusive prefix of the top level (length 1 or 0)
    for lop, lb, n in reversed(levels):
        out = torch.empty_like(lb)
        out[_sl(dim, slice(1, None, 2))] = prefix
        out[_sl(dim, slice(0, 1))] = lb[_sl(dim, slice(0, 1))]
        n_even = (n + 1) // 2
        if n_even > 1:
            evens = _sl(dim, slice(2, None, 2))
            op_e = lop.select_time(dim, slice(2, None, 2))
            out[evens] = op_e.apply(prefix[_sl(dim, slice(0, n_even - 1))]) + lb[evens]
        prefix = out
    return prefix
