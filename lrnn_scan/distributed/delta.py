"""Sequence-parallel chunkwise DeltaProduct: exchanges ``K x K`` totals and ``K x V`` states."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .common import _all_gather, _exchange, _group_info

# ----------------------------------------------------------------------------------- delta product
class _DeltaCfg:
    def __init__(self, group, rank, world, scale, chunk_size, backend, shapes, cdt):
        self.group, self.rank, self.world = group, rank, world
        self.scale, self.chunk_size, self.backend = scale, chunk_size, backend
        self.B, self.T, self.n_h, self.H, self.K, self.V = shapes
        self.cdt = cdt


def _delta_local(cfg: _DeltaCfg, q, k, v, beta, g, h0, final=True):
    from ..delta import chunk_delta_product as cdp

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
    from ..delta._checks import check_inputs

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
    from ..delta import chunk_delta_product as cdp

    return cdp(q, k, v, beta, g, scale=scale, initial_state=h0,
               output_final_state=output_final_state, chunk_size=chunk_size, backend=backend)
