"""Sequence-parallel scans over a ``torch.distributed`` process group (issue 8).

The sequence is split along time into contiguous shards, one per rank of ``group`` in rank order
(rank 0 holds the earliest steps). Because the scan combine is associative
(``shared/reference/math.md`` §1), the whole recurrence ``h_t = A_t h_{t-1} + b_t`` is solved
exactly with one small all-gather:

Forward, on rank ``r`` with shard ``t = 1..T_r``:

1. rank ``r > 0`` reduces its shard with a log-depth tree of the operators' own ``compose``
   (:func:`tree_reduce`) into the shard's *total transition* ``P_r = A_{T_r} ⋯ A_1``, promoted
   to a dense ``(…, d, d)`` tensor with ``to_dense()`` (so totals of any family are plain,
   exchangeable tensors), and its *local final state* ``f_r`` (the state at ``T_r`` from a zero
   initial state). Rank 0 instead scans its shard from ``initial_state`` straight away
   (``f_0`` is then its true final state and ``P_0`` is never needed).
2. one ``all_gather`` of the ``(P_r, f_r)`` pairs (``O(d^2)`` numbers per batch element and rank,
   independent of ``T``).
3. every rank composes the exclusive prefix ``h_init_r = Φ_{r-1}(⋯ Φ_1(f_0))`` with
   ``Φ_j(x) = P_j x + f_j``, and the whole-sequence final state ``Φ_{R-1}(⋯)`` (the same on every
   rank).
4. rank ``r > 0`` scans its shard once more, from ``h_init_r``, with :func:`lrnn_scan.scan`
   (Triton kernels on CUDA where one fits). This rescan is exact; no fix-up term is added.

Backward (the adjoint, math.md §4: ``λ_t = g_t + A_{t+1}^T λ_{t+1}`` crosses shard boundaries):
the cotangent flowing into the end of shard ``r`` from later shards is
``μ_r = A^{(r+1)}_1{}^T λ^{(r+1)}_1``, and with ``ν_r = Σ_t (A_t ⋯ A_1)^T g_t`` (the shard's own
adjoint at its start, from ``μ = 0``, again a log-depth tree over the transposed, time-reversed
operators) it obeys the exclusive *suffix* recursion ``μ_{r-1} = ν_r + P_r^T μ_r`` with
``μ_{R-1}`` = the cotangent of the final state. So one ``all_gather`` of the ``ν_r`` (and of the
final-state cotangents) suffices; the totals ``P_r`` are kept from the forward. Each rank then
backpropagates through its local scan (the engine's adjoint scan, or the kernels' backward) with
its output cotangent and ``μ_r`` on its final state, which gives the gradients of its operator
tensors, of ``b``, and on rank 0 of ``initial_state``.

:func:`chunk_delta_product` does the same for the chunkwise DeltaProduct / gated DeltaNet path
(:func:`lrnn_scan.delta.chunk_delta_product`), exchanging ``K x K`` totals and ``K x V`` states.
:func:`halo` gives each rank the last few steps of the earlier shards (for short convolutions).

Conventions (documented in ``docs/distributed.md``):

* ``initial_state`` lives on **rank 0**: it is read on rank 0 only; other ranks may pass ``None``
  or any tensor (ignored, it gets no gradient). A replicated initial state therefore gets its
  whole gradient on rank 0 (zero elsewhere), which is right under a *sum* all-reduce.
* The returned final state is the whole sequence's final state, identical on every rank.
* The loss is the **sum of the per-rank losses**: gradients of ``op``/``b`` are those of the local
  shard; a final-state cotangent given on several ranks is summed.
* Forward and backward are collective: every rank of ``group`` must call :func:`scan` with the
  same operator family, non-time shapes, dtype, ``dim`` and state kind, and, when gradients are
  needed, every rank must backpropagate through its outputs (a rank whose inputs do not require
  gradients while another's do raises a ``RuntimeError`` on every rank instead of hanging).
* ``cu_seqlens`` (packed variable-length batches) is not supported across ranks.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from .api import SCAN_METHODS
from .api import scan as _local_scan
from .operators import Companion, TransitionOperator, compose

__all__ = ["scan", "chunk_delta_product", "halo", "tree_reduce", "shard_bounds", "shard"]


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


class _Cfg:
    """Static configuration of one call (kept on the autograd context)."""

    def __init__(self, template, dim, method, group, rank, world, newest_only, state_shape, cdt):
        self.template, self.dim, self.method, self.group = template, dim, method, group
        self.rank, self.world, self.newest_only = rank, world, newest_only
        self.state_shape, self.cdt = state_shape, cdt
        self.vector = len(state_shape) == template.batch_ndim   # (*batch w/o time, d)
        self.d = template.state_size


def _full_state(cfg: _Cfg, x: Tensor) -> Tensor:
    """Newest-only Companion inputs/cotangents ``(*batch)`` -> full ``(*batch, m)``."""
    x = x.to(cfg.cdt)
    if not cfg.newest_only:
        return x
    full = x.new_zeros(*x.shape, cfg.d)
    full[..., 0] = x
    return full


def _shard_totals(cfg: _Cfg, op: TransitionOperator, b: Tensor):
    """``(P, f)``: the shard's dense total transition ``(*S, d, d)`` and local final state."""
    dim, T = cfg.dim, b.shape[cfg.dim]
    S = cfg.state_shape[:cfg.template.batch_ndim - 1]
    if T == 0:
        eye = torch.eye(cfg.d, dtype=cfg.cdt, device=b.device)
        return eye.expand(*S, cfg.d, cfg.d), b.new_zeros(cfg.state_shape, dtype=cfg.cdt)
    total, fin = tree_reduce(op.map(lambda t: t.to(cfg.cdt)), _full_state(cfg, b), dim)
    P = total.to_dense().squeeze(dim)
    return P.expand(*S, cfg.d, cfg.d), fin.squeeze(dim)


def _run_local(cfg: _Cfg, params: Sequence[Tensor], b: Tensor, h0: Tensor | None,
               needs: Sequence[bool], record: bool):
    """Local scan of the shard from ``h0``; with ``record`` keep its autograd graph (on detached
    leaves) for the backward. Returns ``(h, final, graph)``."""
    T = b.shape[cfg.dim]
    if T == 0:
        fin = b.new_zeros(cfg.state_shape, dtype=cfg.cdt) if h0 is None else h0.to(cfg.cdt)
        return b.clone(), fin, None
    if not record:
        h, fin = _local_scan(cfg.template.with_tensors(*params), b, initial_state=h0,
                             output_final_state=True, dim=cfg.dim, method=cfg.method)
        return h, fin, None
    with torch.enable_grad():
        b_l = b.detach().requires_grad_(needs[0])
        h_l = None if h0 is None else h0.detach().requires_grad_(needs[1])
        p_l = [p.detach().requires_grad_(n and p.is_floating_point())
               for p, n in zip(params, needs[2:])]
        h, fin = _local_scan(cfg.template.with_tensors(*p_l), b_l, initial_state=h_l,
                             output_final_state=True, dim=cfg.dim, method=cfg.method)
    return h.detach(), fin.detach(), (h, fin, b_l, h_l, p_l)


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


def _forward(cfg: _Cfg, b: Tensor, h0: Tensor | None, params: Sequence[Tensor], grad_flag: bool,
             needs: Sequence[bool] = (), record: bool = False):
    """The forward algorithm. Returns ``(h, global_final, totals, graph)``."""
    rank, world, dim = cfg.rank, cfg.world, cfg.dim
    op = cfg.template.with_tensors(*params)
    S = cfg.state_shape[:cfg.template.batch_ndim - 1]
    P_shape = (*S, cfg.d, cfg.d)

    def compute():
        if rank == 0:               # the only rank that reads initial_state
            h, fin, graph = _run_local(cfg, params, b, h0, needs, record)
            return torch.zeros(P_shape, dtype=cfg.cdt, device=b.device), fin, (h, graph)
        if cfg.method == "kernel" and b.shape[dim] > 0:    # fail before the exchange, not after
            from .dispatch import kernel_for
            if kernel_for(op, b, dim, False, None)[0] is None:
                raise ValueError(f"method='kernel': {kernel_for(op, b, dim, False, None)[1]}")
        with torch.no_grad():
            P, fin = _shard_totals(cfg, op, b)
        return P, fin, None

    totals, finals, extra = _exchange("lrnn_scan.distributed.scan", compute, P_shape,
                                      cfg.state_shape, cfg.cdt, b.device, grad_flag, world,
                                      cfg.group)
    h, graph = extra if rank == 0 else (None, None)
    x = finals[0]
    h_init = None
    for j in range(1, world):
        if j == rank:
            h_init = x
        x = _matvec(totals[j], x, cfg.vector) + finals[j]
    if rank > 0:
        needs = (needs[0], False, *needs[2:]) if needs else needs
        h, _, graph = _run_local(cfg, params, b, h_init, needs, record)
    return h, x, totals, graph


# ----------------------------------------------------------------------------------- autograd
class _SequenceParallelScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg: _Cfg, b: Tensor, h0: Tensor | None, *params: Tensor):
        needs = ctx.needs_input_grad[1:]
        h, final, totals, graph = _forward(cfg, b, h0, params, True, needs, record=True)
        ctx.cfg, ctx.totals, ctx.graph = cfg, totals, graph
        ctx.save_for_backward(*params)
        ctx.set_materialize_grads(False)
        return h, final

    @staticmethod
    @once_differentiable
    def backward(ctx, gh: Tensor | None, gf: Tensor | None):
        cfg = ctx.cfg
        params = ctx.saved_tensors
        rank, world, dim = cfg.rank, cfg.world, cfg.dim
        graph, totals = ctx.graph, ctx.totals
        ctx.graph = None                     # free the local graph after this backward
        T = graph[0].shape[dim] if graph is not None else 0
        dev = params[0].device
        # ν_r = Σ_t (A_t ⋯ A_1)^T g_t: the shard's adjoint at its start, from a zero end cotangent.
        nu = torch.zeros(cfg.state_shape, dtype=cfg.cdt, device=dev)
        if rank > 0 and T > 0 and gh is not None:
            with torch.no_grad():
                op_t = cfg.template.with_tensors(*params).map(lambda t: t.to(cfg.cdt)).transpose()
                x = op_t.apply(_full_state(cfg, gh)).flip(dim)
                _, nu = tree_reduce(op_t.map(lambda t: t.flip(dim)), x, dim, need_op=False)
                nu = nu.squeeze(dim)
        gf_local = torch.zeros_like(nu) if gf is None else gf.to(cfg.cdt)
        gathered = _all_gather(torch.cat([nu.reshape(-1), gf_local.reshape(-1)]), world,
                               cfg.group)
        n = nu.numel()
        mu = sum(g[n:] for g in gathered).view(cfg.state_shape)    # cotangent of the final state
        for j in range(world - 1, rank, -1):                      # exclusive suffix over ranks
            mu = _matvec(totals[j].mT, mu, cfg.vector) + gathered[j][:n].view(cfg.state_shape)
        db = dh0 = None
        dparams = [None] * len(params)
        if graph is not None:
            h, fin, b_l, h_l, p_l = graph
            outs, cots = [fin], [mu.to(fin.dtype)]
            if gh is not None:
                outs.append(h)
                cots.append(gh)
            leaves = [(i, t) for i, t in enumerate([b_l, h_l, *p_l])
                      if t is not None and t.requires_grad]
            if leaves:
                grads = torch.autograd.grad(outs, [t for _, t in leaves], cots, allow_unused=True)
                full = [None] * (2 + len(p_l))
                for (i, t), g in zip(leaves, grads):
                    full[i] = torch.zeros_like(t) if g is None else g
                db, dh0, dparams = full[0], full[1], full[2:]
        else:                                # empty shard: h_T = h_0 on rank 0, nothing else
            if rank == 0 and ctx.needs_input_grad[2]:
                dh0 = mu.clone()
            dparams = [torch.zeros_like(p) if ctx.needs_input_grad[3 + i] else None
                       for i, p in enumerate(params)]
            if ctx.needs_input_grad[1] and gh is not None:
                db = torch.zeros_like(gh)
        if rank != 0:
            dh0 = None
        return (None, db, dh0, *dparams)


# ----------------------------------------------------------------------------------- public API
def scan(op: TransitionOperator, b: Tensor, *, initial_state: Tensor | None = None,
         output_final_state: bool = False, group=None, dim: int = 1, method: str = "auto",
         cu_seqlens: Tensor | None = None):
    """Sequence-parallel :func:`lrnn_scan.scan` over the ranks of a process group.

    Each rank passes its own contiguous time shard of ``op`` and ``b`` (rank ``i`` of ``group``
    holds the ``i``-th shard; shards may have different lengths, including 1 or 0 steps). The
    result on each rank is that rank's slice of the single-process ``lrnn_scan.scan`` of the
    concatenated sequence.

    Args:
        op: the shard's operator (any :class:`~lrnn_scan.operators.TransitionOperator`), time at
            batch dim ``dim``; non-time batch shape, family and state size equal on every rank.
        b: the shard's inputs, ``(*batch_shape, d)`` or ``(*batch_shape, d, c)`` (or
            ``(*batch_shape,)`` for a ``Companion``: the newest component, as in
            :func:`lrnn_scan.scan`).
        initial_state: ``h_0`` of the whole sequence, read **on rank 0 only** (other ranks may
            pass ``None`` or the same tensor; it is ignored there and gets no gradient).
        output_final_state: also return the final state of the whole sequence (the same on every
            rank; its cotangents from all ranks are summed in the backward).
        group: the process group (default: the world).
        dim: time dim (default 1, the ``[B, T, ...]`` layout).
        method: the local scan's method (see :func:`lrnn_scan.scan`; ``"auto"`` uses the Triton
            kernels on CUDA where one fits). The shard reductions always use the torch tree.
        cu_seqlens: not supported across ranks (raises ``NotImplementedError``).

    Returns:
        ``h`` (this rank's shard of the states, ``b``'s shape and dtype), or ``(h, h_final)``.
        Differentiable w.r.t. ``b``, every operator tensor and (rank 0) ``initial_state``.
        The loss is taken as the sum of the per-rank losses; every rank must run the backward.
    """
    if cu_seqlens is not None:
        raise NotImplementedError(
            "lrnn_scan.distributed.scan: cu_seqlens (packed variable-length sequences) is not "
            "supported across ranks; shard a padded [B, T, ...] batch along time instead, or run "
            "lrnn_scan.scan with cu_seqlens on one rank")
    if not isinstance(op, TransitionOperator):
        raise TypeError(f"op must be a lrnn_scan TransitionOperator, got {type(op).__name__}")
    if not isinstance(b, Tensor):
        raise TypeError(f"b must be a torch.Tensor, got {type(b).__name__}")
    if method not in SCAN_METHODS:
        raise ValueError(f"method must be one of {SCAN_METHODS}, got {method!r}")
    nb = op.batch_ndim
    if not 0 <= dim < nb:
        raise ValueError(f"dim must index a batch dim of op (0 <= dim < {nb}); got dim={dim}")
    if tuple(b.shape[:nb]) != tuple(op.batch_shape):
        raise ValueError(f"b must start with op.batch_shape={tuple(op.batch_shape)}; got "
                         f"{tuple(b.shape)}")
    if b.dtype != op.dtype:
        raise TypeError(f"b has dtype {b.dtype} but op has dtype {op.dtype}; they must match")
    if b.device != op.device:
        raise ValueError(f"b is on {b.device} but op is on {op.device}; they must match")
    rank, world = _group_info(group)
    if world == 1:
        return _local_scan(op, b, initial_state=initial_state,
                           output_final_state=output_final_state, dim=dim, method=method)
    newest_only = isinstance(op, Companion) and tuple(b.shape) == tuple(op.batch_shape)
    tail = (op.state_size,) if newest_only else tuple(b.shape[nb:])
    if len(tail) not in (1, 2) or tail[0] != op.state_size:
        raise ValueError(f"b must have shape (*batch_shape, d) or (*batch_shape, d, c) with "
                         f"d={op.state_size}; got {tuple(b.shape)}")
    state_shape = tuple(b.shape[:dim]) + tuple(b.shape[dim + 1:nb]) + tail
    h0 = initial_state
    if h0 is not None:
        if not isinstance(h0, Tensor) or not h0.is_floating_point():
            raise TypeError(f"initial_state must be a floating torch.Tensor, got {h0!r:.80}")
        if tuple(h0.shape) != state_shape:
            raise ValueError(f"initial_state must have shape {state_shape} (the state without "
                             f"the time dim); got {tuple(h0.shape)}")
        if h0.device != b.device:
            raise ValueError(f"initial_state is on {h0.device} but b is on {b.device}")
    cdt = torch.promote_types(b.dtype, torch.float32)
    cfg = _Cfg(op, dim, method, group, rank, world, newest_only, state_shape, cdt)
    params = op.tensors()
    grad = torch.is_grad_enabled() and (b.requires_grad or any(t.requires_grad for t in params)
                                        or (h0 is not None and h0.requires_grad))
    if grad:
        h, final = _SequenceParallelScan.apply(cfg, b, h0, *params)
    else:
        h, final, _, _ = _forward(cfg, b, h0, params, False)
    return (h, final) if output_final_state else h


# ----------------------------------------------------------------------------------- delta product
class _DeltaCfg:
    def __init__(self, group, rank, world, scale, chunk_size, backend, shapes, cdt):
        self.group, self.rank, self.world = group, rank, world
        self.scale, self.chunk_size, self.backend = scale, chunk_size, backend
        self.B, self.T, self.n_h, self.H, self.K, self.V = shapes
        self.cdt = cdt


def _delta_local(cfg: _DeltaCfg, q, k, v, beta, g, h0, final=True):
    from .delta import chunk_delta_product as cdp

    return cdp(q, k, v, beta, g, scale=cfg.scale, initial_state=h0, output_final_state=final,
               chunk_size=cfg.chunk_size, backend=cfg.backend)


def _delta_totals(cfg: _DeltaCfg, q, k, v, beta, g):
    """``(P, F)``: the shard's ``[B, H, K, K]`` total transition and ``[B, H, K, V]`` final state
    from zero, from the chunk path itself: with values ``[v | 0_K]`` and initial state ``[0 | I]``
    the final state is ``[F | P]`` (one pass; two passes when ``V + K`` exceeds what the Triton
    backend takes)."""
    B, H, K, V = cfg.B, cfg.H, cfg.K, cfg.V
    dev = q.device
    if cfg.T == 0:
        eye = torch.eye(K, dtype=cfg.cdt, device=dev).expand(B, H, K, K)
        return eye, torch.zeros(B, H, K, V, dtype=cfg.cdt, device=dev)
    eye = torch.eye(K, dtype=cfg.cdt, device=dev).expand(B, H, K, K).contiguous()
    zk = v.new_zeros(*v.shape[:-1], K)
    if V + K <= 256 or cfg.backend == "torch" or v.dtype == torch.float64:
        h0 = torch.cat([torch.zeros(B, H, K, V, dtype=cfg.cdt, device=dev), eye], dim=-1)
        _, f = _delta_local(cfg, q, k, torch.cat([v, zk], dim=-1), beta, g, h0)
        return f[..., V:].to(cfg.cdt), f[..., :V].to(cfg.cdt)
    _, F = _delta_local(cfg, q, k, v, beta, g, None)
    _, P = _delta_local(cfg, q, k, zk, beta, g, eye)
    return P.to(cfg.cdt), F.to(cfg.cdt)


def _delta_run_local(cfg: _DeltaCfg, xs, h0, needs, record, h0_grad):
    """Local chunk pass from ``h0``; returns ``(o, final, graph)``."""
    q = xs[0]
    if cfg.T == 0:
        fin = (torch.zeros(cfg.B, cfg.H, cfg.K, cfg.V, dtype=cfg.cdt, device=q.device)
               if h0 is None else h0.to(cfg.cdt))
        return q.new_zeros(cfg.B, 0, cfg.H, cfg.V), fin, None
    if not record:
        o, fin = _delta_local(cfg, *xs, h0)
        return o, fin, None
    with torch.enable_grad():
        leaves = [None if x is None else x.detach().requires_grad_(n)
                  for x, n in zip(xs, needs)]
        h_l = None if h0 is None else h0.detach().requires_grad_(h0_grad)
        o, fin = _delta_local(cfg, *leaves, h_l)
    return o.detach(), fin.detach(), (o, fin, leaves, h_l)


def _delta_forward(cfg: _DeltaCfg, xs, h0, grad_flag, needs=(), h0_needs=False, record=False):
    rank, world = cfg.rank, cfg.world
    B, H, K, V = cfg.B, cfg.H, cfg.K, cfg.V
    dev = xs[0].device

    def compute():
        if rank == 0:
            o, F, graph = _delta_run_local(cfg, xs, h0, needs, record, h0_needs)
            return torch.zeros(B, H, K, K, dtype=cfg.cdt, device=dev), F, (o, graph)
        with torch.no_grad():
            P, F = _delta_totals(cfg, *xs)
        return P, F, None

    totals, finals, extra = _exchange("lrnn_scan.distributed.chunk_delta_product", compute,
                                      (B, H, K, K), (B, H, K, V), cfg.cdt, dev, grad_flag, world,
                                      cfg.group)
    o, graph = extra if rank == 0 else (None, None)
    x = finals[0]
    h_init = None
    for j in range(1, world):
        if j == rank:
            h_init = x
        x = totals[j] @ x + finals[j]
    if rank > 0:
        # The initial state's gradient (ν_r) is needed by the previous rank in the backward.
        o, _, graph = _delta_run_local(cfg, xs, h_init, needs, record, True)
    return o, x, totals, graph


class _SequenceParallelDelta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg: _DeltaCfg, h0, *xs):
        needs = ctx.needs_input_grad[2:]
        o, final, totals, graph = _delta_forward(cfg, xs, h0, True, needs,
                                                 ctx.needs_input_grad[1], record=True)
        ctx.cfg, ctx.totals, ctx.graph = cfg, totals, graph
        ctx.shapes = [None if x is None else (x.shape, x.dtype, x.device) for x in xs]
        ctx.set_materialize_grads(False)
        return o, final

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dF):
        cfg, totals, graph = ctx.cfg, ctx.totals, ctx.graph
        ctx.graph = None
        rank, world = cfg.rank, cfg.world
        B, H, K, V = cfg.B, cfg.H, cfg.K, cfg.V
        dev = totals[0].device
        nu = torch.zeros(B, H, K, V, dtype=cfg.cdt, device=dev)
        if rank > 0 and graph is not None and do is not None:
            o, fin, leaves, h_l = graph
            (nu_,) = torch.autograd.grad(o, h_l, do, retain_graph=True, allow_unused=True)
            if nu_ is not None:
                nu = nu_.to(cfg.cdt)
        dF = torch.zeros_like(nu) if dF is None else dF.to(cfg.cdt)
        gathered = _all_gather(torch.cat([nu.reshape(-1), dF.reshape(-1)]), world, cfg.group)
        n = nu.numel()
        mu = sum(x[n:] for x in gathered).view(B, H, K, V)
        for j in range(world - 1, rank, -1):
            mu = totals[j].mT @ mu + gathered[j][:n].view(B, H, K, V)
        grads = [None] * len(ctx.shapes)
        dh0 = None
        if graph is not None:
            o, fin, leaves, h_l = graph
            outs, cots = [fin], [mu.to(fin.dtype)]
            if do is not None:
                outs.append(o)
                cots.append(do)
            want = [(i, t) for i, t in enumerate(leaves) if t is not None and t.requires_grad]
            if rank == 0 and h_l is not None and h_l.requires_grad:
                want.append((-1, h_l))
            if want:
                gs = torch.autograd.grad(outs, [t for _, t in want], cots, allow_unused=True)
                for (i, t), gr in zip(want, gs):
                    gr = torch.zeros_like(t) if gr is None else gr
                    if i < 0:
                        dh0 = gr
                    else:
                        grads[i] = gr
        else:                                 # empty shard
            for i, s in enumerate(ctx.shapes):
                if s is not None and ctx.needs_input_grad[2 + i]:
                    grads[i] = torch.zeros(s[0], dtype=s[1], device=s[2])
            if rank == 0 and ctx.needs_input_grad[1]:
                dh0 = mu.clone()
        return (None, dh0 if rank == 0 else None, *grads)


def chunk_delta_product(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None, *,
                        scale: float | None = None, initial_state: Tensor | None = None,
                        output_final_state: bool = False, group=None, use_qk_l2norm: bool = False,
                        chunk_size: int = 64, backend: str = "auto",
                        cu_seqlens: Tensor | None = None):
    """Sequence-parallel :func:`lrnn_scan.delta.chunk_delta_product` (DeltaProduct / gated
    DeltaNet, fla layout) over the ranks of ``group``; each rank passes its time shard
    ``q [B, T_r, H, K]``, ``k [B, T_r, n_h, H, K]``, ``v [B, T_r, n_h, H, V]``,
    ``beta [B, T_r, n_h, H]``, ``g [B, T_r, H]``.

    Same conventions as :func:`scan` (``initial_state [B, H, K, V]`` read on rank 0; the returned
    final state is the whole sequence's, on every rank; the loss is the sum of the per-rank
    losses; collective forward and backward; no ``cu_seqlens``). The exchanged quantities are the
    ``K x K`` shard totals and ``K x V`` states, per batch element and head. Ranks ``> 0`` run the
    chunk path twice in the forward (totals with values ``[v | 0]`` from ``[0 | I]``, then the
    rescan from the true initial state) and twice in the backward (the initial-state adjoint for
    the previous rank, then all gradients); rank 0 once each.

    Returns ``(o [B, T_r, H, V], final_state or None)`` like the single-process function.
    """
    if cu_seqlens is not None:
        raise NotImplementedError(
            "lrnn_scan.distributed.chunk_delta_product: cu_seqlens is not supported across "
            "ranks; shard a padded [B, T, ...] batch along time instead")
    from .delta._checks import check_inputs

    rank, world = _group_info(group)
    if use_qk_l2norm:
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
    if world == 1:
        return _delta_local_public(q, k, v, beta, g, scale, initial_state, output_final_state,
                                   chunk_size, backend)
    B, T, n_h, H, K, V, _ = check_inputs(q, k, v, beta, g, scale, initial_state, None,
                                         chunk_size, backend)
    scale = float(K ** -0.5 if scale is None else scale)
    if backend == "auto":
        backend = "triton" if (q.is_cuda and q.dtype != torch.float64) else "torch"
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    cfg = _DeltaCfg(group, rank, world, scale, chunk_size, backend, (B, T, n_h, H, K, V), cdt)
    h0 = initial_state
    xs = (q, k, v, beta, g)
    grad = torch.is_grad_enabled() and (any(x is not None and x.requires_grad for x in xs)
                                        or (h0 is not None and h0.requires_grad))
    if grad:
        o, final = _SequenceParallelDelta.apply(cfg, h0, *xs)
    else:
        o, final, _, _ = _delta_forward(cfg, xs, h0 if rank == 0 else None, False)
    return o, (final if output_final_state else None)


def _delta_local_public(q, k, v, beta, g, scale, h0, output_final_state, chunk_size, backend):
    from .delta import chunk_delta_product as cdp

    return cdp(q, k, v, beta, g, scale=scale, initial_state=h0,
               output_final_state=output_final_state, chunk_size=chunk_size, backend=backend)


# ----------------------------------------------------------------------------------- halo
def _tail_buffer(x: Tensor, width: int, dim: int, cdt) -> Tensor:
    """``[len, last len steps of x left-padded with zeros to width]`` flattened, in ``cdt``."""
    T = x.shape[dim]
    n = min(width, T)
    tail = x.narrow(dim, T - n, n).to(cdt)
    pad_shape = list(x.shape)
    pad_shape[dim] = width - n
    tail = torch.cat([tail.new_zeros(pad_shape), tail], dim=dim)
    return torch.cat([torch.full((1,), float(n), dtype=cdt, device=x.device), tail.reshape(-1)])


def _halo_index(lens: list[int], rank: int, width: int) -> list[tuple[int, int, int]]:
    """For rank ``rank``: ``(halo position, source rank, source position in its padded tail)``
    for every halo step that exists (the others stay zero)."""
    out, pos = [], width - 1
    for j in range(rank - 1, -1, -1):
        for s in range(width - 1, width - 1 - lens[j], -1):
            if pos < 0:
                return out
            out.append((pos, j, s))
            pos -= 1
    return out


class _Halo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, width: int, dim: int, group, rank: int, world: int):
        cdt = torch.promote_types(x.dtype, torch.float32)
        shape = list(x.shape)
        shape[dim] = width
        bufs = _all_gather(_tail_buffer(x, width, dim, cdt), world, group)
        lens = [int(n) for n in torch.stack([b[0] for b in bufs]).tolist()]
        tails = [b[1:].view(shape) for b in bufs]
        halo = x.new_zeros(shape, dtype=cdt)
        for p, j, s in _halo_index(lens, rank, width):
            halo.narrow(dim, p, 1).copy_(tails[j].narrow(dim, s, 1))
        ctx.meta = (width, dim, group, rank, world, lens, cdt, x.shape[dim])
        return halo.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        width, dim, group, rank, world, lens, cdt, T = ctx.meta
        shape = list(g.shape)
        grads = _all_gather(g.to(cdt).contiguous().reshape(-1), world, group)
        grads = [x.view(shape) for x in grads]
        tail_grad = g.new_zeros(shape, dtype=cdt)           # this rank's padded tail
        for r in range(rank + 1, world):
            for p, j, s in _halo_index(lens, r, width):
                if j == rank:
                    tail_grad.narrow(dim, s, 1).add_(grads[r].narrow(dim, p, 1))
        n = lens[rank]
        full = list(shape)
        full[dim] = T
        dx = g.new_zeros(full, dtype=cdt)
        if n:
            dx.narrow(dim, T - n, n).copy_(tail_grad.narrow(dim, width - n, n))
        return dx.to(g.dtype), None, None, None, None, None


def halo(x: Tensor, width: int, *, group=None, dim: int = 1) -> Tensor:
    """The ``width`` time steps just before this rank's shard (the end of the earlier ranks'
    shards, zeros where the sequence has no earlier steps), for layers that look back a few steps
    across shard boundaries, e.g. a causal short convolution of kernel size ``k``::

        x_ext = torch.cat([lsd.halo(x, k - 1), x], dim=1)    # then convolve without left padding

    ``x``: this rank's shard, time at ``dim``; shards may be shorter than ``width`` (steps are
    taken from as many earlier ranks as needed). Returns ``x``'s shape with ``width`` steps at
    ``dim``. Differentiable: the halo's gradient is sent back to the ranks that own those steps
    (one all-gather each way). Collective: every rank must call it, and run its backward when
    gradients are needed.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(width, int) or width < 0:
        raise ValueError(f"width must be a non-negative int, got {width!r}")
    if not 0 <= dim < x.dim():
        raise ValueError(f"dim must be in [0, {x.dim()}), got {dim}")
    rank, world = _group_info(group)
    if width == 0 or world == 1:            # nothing before the sequence: zeros
        shape = list(x.shape)
        shape[dim] = width
        return x.new_zeros(shape)
    return _Halo.apply(x, width, dim, group, rank, world)
