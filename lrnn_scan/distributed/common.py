"""Helpers shared by the sequence-parallel scans: sharding, tree reduction, the exchange."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ..operators import TransitionOperator, compose

# ----------------------------------------------------------------------------------- helpers
def shard_bounds(T: int, world_size: int, rank: int,
                 weights: Sequence[float] | None = None) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous time shard of ``T`` steps.

    Without ``weights`` the split is as even as possible (the first ``T % world_size`` ranks get
    one step more). With ``weights`` (one positive number per rank) rank ``i`` gets about
    ``T * weights[i] / sum(weights)`` steps; e.g. ``[2, 1]`` gives rank 0 two thirds, which
    balances the work of :func:`scan` when the shard reduction costs about as much as the local
    scan (rank 0 does no reduction). Any other contiguous split works with :func:`scan` too.
    """
    if world_size < 1 or not 0 <= rank < world_size or T < 0:
        raise ValueError(f"shard_bounds: need T >= 0 and 0 <= rank < world_size; got T={T}, "
                         f"world_size={world_size}, rank={rank}")
    if weights is None:
        base, extra = divmod(T, world_size)
        start = rank * base + min(rank, extra)
        return start, start + base + (1 if rank < extra else 0)
    w = [float(x) for x in weights]
    if len(w) != world_size or not all(x > 0 for x in w):
        raise ValueError(f"shard_bounds: weights must be {world_size} positive numbers; got "
                         f"{list(weights)}")
    cum = [0.0]
    for x in w:
        cum.append(cum[-1] + x)
    edge = lambda i: round(T * cum[i] / cum[-1])  # noqa: E731
    return edge(rank), edge(rank + 1)


def shard(x, start: int, stop: int, dim: int = 1):
    """Time slice ``[start, stop)`` along ``dim`` of a tensor or an operator."""
    if isinstance(x, TransitionOperator):
        return x.select_time(dim, slice(start, stop))
    return x.narrow(dim, start, stop - start)


def tree_reduce(op: TransitionOperator, x: Tensor | None, dim: int, need_op: bool = True):
    """Combine all scan elements ``(A_t, x_t)`` along ``dim`` with a log-depth tree.

    Returns ``(A_T ⋯ A_1, Σ_t A_T ⋯ A_{t+1} x_t)`` — the total transition and the final state
    from a zero initial state — both keeping a time dim of size 1 at ``dim``. Pairs are combined
    with ``(A_j A_i, A_j x_i + x_j)`` (earlier ``i``, later ``j``), using the family's own
    :meth:`~TransitionOperator.compose` (mixed families promote to dense blocks); an odd element
    at the end of a level is set aside and folded in at the end. ``x`` may be ``None`` (operator
    only); with ``need_op=False`` the compositions the state part does not need are skipped and
    the returned operator is ``None``. The time length must be at least 1.
    """
    n = op.batch_shape[dim]
    if n < 1:
        raise ValueError("tree_reduce needs at least one time step")
    tails = []                              # set-aside odd elements, latest first
    while n > 1:
        if n % 2:
            tails.append((op.select_time(dim, slice(n - 1, n)),
                          None if x is None else x.narrow(dim, n - 1, 1)))
            n -= 1
        ev, od = slice(0, n, 2), slice(1, n, 2)
        later = op.select_time(dim, od)
        if x is not None:
            sl = (slice(None),) * dim
            x = later.apply(x[sl + (ev,)]) + x[sl + (od,)]
        n //= 2
        # The root's operator is only needed by the caller (tails only need their own).
        op = None if (n == 1 and not need_op) else compose(later, op.select_time(dim, ev))
    for t_op, t_x in reversed(tails):       # fold in time order: root, then later tails
        if x is not None:
            x = t_op.apply(x) + t_x
        op = compose(t_op, op) if need_op else None
    return op, x


def _matvec(M: Tensor, x: Tensor, vector: bool) -> Tensor:
    return (M @ x.unsqueeze(-1)).squeeze(-1) if vector else M @ x


def _group_info(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("lrnn_scan.distributed.scan needs an initialised torch.distributed "
                           "process group (torch.distributed.init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather(buf: Tensor, world: int, group) -> list[Tensor]:
    buf = buf.contiguous()
    out = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(out, buf, group=group)
    return out



def _exchange(name: str, compute, P_shape, f_shape, cdt, dev, grad_flag: bool, world: int,
              group):
    """Run this rank's pre-exchange work ``compute() -> (P, f, extra)`` and all-gather
    ``[flag, P, f]`` from every rank. An exception in ``compute`` does not leave the other ranks
    waiting: the rank sends an error flag, re-raises after the collective, and every other rank
    raises a ``RuntimeError``; likewise when ranks disagree about needing gradients (the backward
    is collective). Returns ``(totals, finals, extra)`` (lists over ranks)."""
    err, extra = None, None
    try:
        P, f, extra = compute()
        flag = float(grad_flag)
    except Exception as exc:                     # noqa: BLE001 - re-raised below
        err, flag = exc, -1.0
        P = torch.zeros(P_shape, dtype=cdt, device=dev)
        f = torch.zeros(f_shape, dtype=cdt, device=dev)
    head = torch.full((1,), flag, dtype=cdt, device=dev)
    gathered = _all_gather(torch.cat([head, P.reshape(-1).to(cdt), f.reshape(-1).to(cdt)]),
                           world, group)
    flags = torch.stack([g[0] for g in gathered]).tolist()
    if err is not None:
        raise err
    failed = [i for i, x in enumerate(flags) if x < 0]
    if failed:
        raise RuntimeError(f"{name}: rank(s) {failed} of the group raised an error before the "
                           "exchange (see their traceback); raising here too instead of hanging")
    if any(flags) and not all(flags):
        raise RuntimeError(
            f"{name}: gradients are needed on ranks {[i for i, x in enumerate(flags) if x]} but "
            f"not on ranks {[i for i, x in enumerate(flags) if not x]}; the backward is "
            "collective, so every rank's inputs must require gradients (or none, e.g. under "
            "torch.no_grad())")
    nP = P.numel()
    totals = [g[1:1 + nP].view(P_shape) for g in gathered]
    finals = [g[1 + nP:].view(f_shape) for g in gathered]
    return totals, finals, extra
