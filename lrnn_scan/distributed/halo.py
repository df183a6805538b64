"""``halo``: the last steps of the earlier shards (context for short convolutions)."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .common import _all_gather, _group_info

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
