"""``lrnn_scan.scan``: the one public entry point for linear recurrences over any operator."""
from __future__ import annotations

import torch
from torch import Tensor

from . import dispatch
from .adjoint import scan_with_adjoint
from .operators import Companion, TransitionOperator

__all__ = ["scan", "SCAN_METHODS"]

SCAN_METHODS = ("auto", "blelloch", "sequential", "kernel")


def scan(op: TransitionOperator, b: Tensor, *, initial_state: Tensor | None = None,
         output_final_state: bool = False, reverse: bool = False,
         cu_seqlens: Tensor | None = None, dim: int = 1, method: str = "auto"):
    """All states of the linear recurrence ``h_t = A_t h_{t-1} + b_t``.

    Args:
        op: a :class:`~lrnn_scan.operators.TransitionOperator` (``Diagonal``, ``BlockDiagonal``,
            ``Companion``, ``HouseholderProduct``, a composition, or your own) whose
            ``batch_shape`` includes time at dim ``dim``, e.g. ``(B, T, H)`` for
            ``BlockDiagonal(A)`` with ``A: (B, T, H, m, m)``.
        b: inputs, ``(*batch_shape, d)`` (vector state) or ``(*batch_shape, d, c)`` (matrix
            state, e.g. DeltaNet's ``d_k x d_v``). For a ``Companion`` operator ``b`` may also be
            ``(*batch_shape,)``: the input then enters the newest state component and ``h`` holds
            the newest component only (the H-LRU output).
        initial_state: ``h_0``, the state's shape without the time dim (``(num_seqs, ...)`` with
            ``cu_seqlens``); zeros when ``None``.
        output_final_state: also return the last state of each sequence.
        reverse: run backwards in time, ``h_t = A_t h_{t+1} + b_t`` (the final state is then
            the state at ``t = 0``).
        cu_seqlens: int64 ``(num_seqs + 1,)`` cumulative sequence lengths for a packed batch
            (fla convention: ``B == 1``, ``dim == 1``); each sequence starts from its own
            initial state.
        dim: the time dim of ``op.batch_shape`` and ``b`` (default 1: ``[B, T, ...]`` layout).
            The kernels take time at dim 1, or as the last batch dim of a ``Diagonal`` with state
            size 1 (``a, b: (B, N, T, 1)``, ``dim=2``: independent scalar rows, time contiguous).
        method: ``"auto"`` (Triton kernels for CUDA tensors of the families that have one, else
            ``"blelloch"``), ``"blelloch"`` (work-efficient tree, ``O(log T)`` depth),
            ``"sequential"`` (reference loop) or ``"kernel"`` (Triton only; error if none fits).

    Returns:
        ``h`` with ``b``'s shape (and dtype), or ``(h, h_final)`` if ``output_final_state``.
        The torch paths compute in ``float32`` or wider; ``h_final`` is float32 for half-precision
        inputs and ``b``'s dtype otherwise. Differentiable w.r.t. ``b``, ``initial_state`` and
        every tensor of ``op``, through the adjoint scan with transposed operators.

    Values are not checked (that would synchronise the device): NaN or inf in ``op`` or ``b``
    propagate to the states after them, as in any torch op. The operators' constructors check
    what their structure needs (e.g. ``HouseholderProduct(check_values=True)``).

    Example:
        >>> import torch, lrnn_scan as ls
        >>> A = torch.randn(2, 100, 4, 3, 3) / 3             # (B, T, H, m, m)
        >>> b = torch.randn(2, 100, 4, 3)
        >>> h, hT = ls.scan(ls.BlockDiagonal(A), b, output_final_state=True)
        >>> h.shape, hT.shape
        (torch.Size([2, 100, 4, 3]), torch.Size([2, 4, 3]))
    """
    if not isinstance(op, TransitionOperator):
        raise TypeError(f"op must be a lrnn_scan TransitionOperator, got {type(op).__name__}")
    if not isinstance(b, Tensor):
        raise TypeError(f"b must be a torch.Tensor, got {type(b).__name__}")
    if method not in SCAN_METHODS:
        raise ValueError(f"method must be one of {SCAN_METHODS}, got {method!r}")
    nb = op.batch_ndim
    if not 0 <= dim < nb:
        raise ValueError(f"dim must index a batch dim of op (0 <= dim < {nb}, op.batch_shape="
                         f"{tuple(op.batch_shape)}); got dim={dim}")
    if b.dtype != op.dtype:
        raise TypeError(f"b has dtype {b.dtype} but op has dtype {op.dtype}; they must match")
    if b.device != op.device:
        raise ValueError(f"b is on {b.device} but op is on {op.device}; they must match")

    newest_only = isinstance(op, Companion) and tuple(b.shape) == tuple(op.batch_shape)
    bad_rank = b.dim() not in (nb + 1, nb + 2) and not newest_only
    if tuple(b.shape[:nb]) != tuple(op.batch_shape) or bad_rank:
        raise ValueError(f"b must have shape (*batch_shape, d) or (*batch_shape, d, c) with "
                         f"batch_shape={tuple(op.batch_shape)} and d={op.state_size}"
                         f"{' (or batch_shape alone for Companion)' if isinstance(op, Companion) else ''}"
                         f"; got {tuple(b.shape)}")
    if not newest_only and b.shape[nb] != op.state_size:
        raise ValueError(f"b: dim {nb} (the state) must have size d={op.state_size} (op.state_size); "
                         f"got shape {tuple(b.shape)}")

    if method in ("auto", "kernel"):
        out = dispatch.try_kernel_scan(op, b, initial_state, output_final_state, reverse,
                                       cu_seqlens, dim, required=(method == "kernel"))
        if out is not None:
            return out if output_final_state else out[0]
    algo = "blelloch" if method in ("auto", "kernel") else method

    if newest_only:
        full = torch.zeros(*b.shape, op.state_size, dtype=b.dtype, device=b.device)
        full[..., 0] = b
        res = scan(op, full, initial_state=initial_state, output_final_state=output_final_state,
                   reverse=reverse, cu_seqlens=cu_seqlens, dim=dim, method=algo)
        return (res[0][..., 0], res[1]) if output_final_state else res[..., 0]

    state_shape = b.shape[:dim] + b.shape[dim + 1:]
    if cu_seqlens is not None:
        h, h_final = _varlen(op, b, initial_state, cu_seqlens, dim, reverse, algo)
    else:
        if initial_state is not None:
            _check_state("initial_state", initial_state, tuple(state_shape), b)
        h, h_final = _dense(op, b, initial_state, dim, reverse, algo)
    return (h, h_final) if output_final_state else h


def _check_state(name: str, s, shape: tuple, b: Tensor) -> None:
    if not isinstance(s, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
    if tuple(s.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (b's shape without the time dim); got "
                         f"{tuple(s.shape)}")
    if not s.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {s.dtype}")
    if s.device != b.device:
        raise ValueError(f"{name} is on {s.device} but b is on {b.device}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _dense(op, b, h0, dim, reverse, algo):
    T, in_dtype = b.shape[dim], b.dtype
    cdt = _compute_dtype(b.dtype)
    if cdt != b.dtype:
        op, b = op.map(lambda t: t.to(cdt)), b.to(cdt)
    h0 = None if h0 is None else h0.to(cdt)
    if T == 0:
        final = torch.zeros_like(b.sum(dim)) if h0 is None else h0.clone()
        return b.clone().to(in_dtype), final
    if reverse:
        op, b = op.map(lambda t: t.flip(dim)), b.flip(dim)
    h = scan_with_adjoint(op, b, h0, dim, algo)
    if reverse:
        h = h.flip(dim)
    final = h.select(dim, 0 if reverse else T - 1)
    return h.to(in_dtype), final


def _varlen(op, b, h0, cu_seqlens, dim, reverse, algo):
    """Packed sequences: gather into a padded ``(num_seqs, L_max)`` batch, scan, scatter back.

    Padding repeats each sequence's last element *after* its end, so it never influences a real
    output (and gets zero gradient: every later cotangent is zero)."""
    if dim != 1 or b.shape[0] != 1:
        raise ValueError(f"cu_seqlens needs the packed layout: dim=1 and batch size 1; got dim={dim},"
                         f" b.shape={tuple(b.shape)}")
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64) \
            or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must be a 1-D int32/int64 tensor (num_seqs + 1,) of cumulative "
                         f"lengths; got {cu_seqlens!r}")
    cu = cu_seqlens.to(device=b.device, dtype=torch.int64)
    total = b.shape[1]
    lens = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lens < 0).any()):
        raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at T={total}; got "
                         f"{cu_seqlens.tolist()}")
    n, L = lens.numel(), max(int(lens.max()), 1)
    state_shape = (n,) + tuple(b.shape[2:])
    if h0 is not None:
        _check_state("initial_state", h0, state_shape, b)
    j = torch.arange(L, device=b.device)
    if reverse:
        j_eff = (lens[:, None] - 1 - j[None, :]).clamp(min=0)
    else:
        j_eff = torch.minimum(j[None, :], (lens[:, None] - 1).clamp(min=0))
    idx = (cu[:-1, None] + j_eff).clamp(max=max(total - 1, 0)).reshape(-1)

    def gather(t):
        return t.index_select(1, idx).reshape(n, L, *t.shape[2:])

    h_pad, final = _dense(op.map(gather), gather(b), h0, 1, False, algo)
    # Scatter back: packed position p of sequence i, local index j -> padded row i*L + j.
    seq_of = torch.repeat_interleave(torch.arange(n, device=b.device), lens)
    local = torch.arange(total, device=b.device) - cu[:-1].index_select(0, seq_of)
    if reverse:
        local = lens.index_select(0, seq_of) - 1 - local
    flat = h_pad.reshape(n * L, *h_pad.shape[2:])
    h = flat.index_select(0, seq_of * L + local).unsqueeze(0)
    last = (lens - 1).clamp(min=0)
    final = h_pad[torch.arange(n, device=b.device), last]
    empty = lens == 0
    if bool(empty.any()):
        fill = torch.zeros_like(final) if h0 is None else h0.to(final.dtype)
        final = torch.where(empty.view(-1, *([1] * (final.dim() - 1))), fill, final)
    return h.to(b.dtype), final
