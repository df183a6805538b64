"""Sequence-parallel :func:`scan` over any transition operator (see the package docstring)."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..api import SCAN_METHODS
from ..api import scan as _local_scan
from ..operators import Companion, TransitionOperator
from .common import _all_gather, _exchange, _group_info, _matvec, tree_reduce

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
            from ..dispatch import kernel_for
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
