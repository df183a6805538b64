"""The one interface every layer of :mod:`lrnn_scan.models` follows.

``layer(x, state=None, cu_seqlens=None) -> (y, state)``
    ``x``: ``[B, T, d_model]``; ``y``: ``[B, T, d_model]`` (``x``'s dtype). ``state`` is a dict of
    tensors (the recurrent state, keys per layer, see :meth:`RecurrentLayer.state_shapes`), each
    with the batch (or, with ``cu_seqlens``, the sequence) as dim 0; ``None`` means zeros. The
    returned ``state`` is the final state of each row / packed sequence.
``cu_seqlens``
    int64 ``(num_seqs + 1,)`` cumulative lengths of sequences packed along time (``B == 1``, fla
    convention). Every sequence starts from its own row of ``state`` (zeros by default): the
    recurrent state *and* any short-convolution context are reset at sequence boundaries.
``layer.step(x_t, state) -> (y_t, state)``
    One token, ``x_t``: ``[B, d_model]``. Running ``step`` over a sequence equals ``forward``.
``layer.init_state(batch_size)``
    Zero state dict (float32 or wider: the kernel paths keep states in float32).
``layer.flops_per_step()``
    FLOPs of the hidden-to-hidden update per token (H-LRU/BD-LRU paper, Table 5;
    ``shared/reference/math.md`` §8); projections are not counted.
``layer.transition_spectrum(x)``
    Eigenvalues of the per-step transition blocks, a complex tensor (see each layer).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from lrnn_scan.operators import Diagonal, TransitionOperator

__all__ = ["RecurrentLayer", "State", "check_positive_int", "packed_layout"]

State = dict  # dict[str, Tensor]


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum`` or a clear ``ValueError``/``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def packed_layout(x: Tensor, cu_seqlens: Tensor | None):
    """Describe ``x`` ``[B, T, ...]`` as packed sequences.

    Returns ``(cu, seq_of, local)``: int64 offsets ``(n + 1,)`` into the flattened ``B*T`` tokens
    (``n = B`` rows of length ``T`` without ``cu_seqlens``), the sequence of each token and its
    position inside that sequence (both ``(B*T,)``).
    """
    B, T = x.shape[:2]
    dev = x.device
    if cu_seqlens is None:
        cu = torch.arange(0, B * T + 1, max(T, 1), device=dev)[: B + 1]
        if T == 0:
            cu = torch.zeros(B + 1, dtype=torch.int64, device=dev)
    else:
        cu = cu_seqlens.to(device=dev, dtype=torch.int64)
    lens = cu[1:] - cu[:-1]
    seq_of = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)
    local = torch.arange(B * T, device=dev) - cu[:-1].index_select(0, seq_of)
    return cu, seq_of, local


class RecurrentLayer(nn.Module):
    """Base class: input/state validation and the shared parts of the interface.

    Subclasses implement ``_forward(x, state, cu_seqlens)``, ``_step(x_t, state)``,
    ``state_shapes(batch_size)``, ``flops_per_step()`` and either ``transition_operator(x, ...)``
    (then :meth:`transition_spectrum` is generic) or ``transition_spectrum`` itself.
    """

    d_model: int

    #: Sequence parallelism (``lrnn_scan.distributed``): layers that support it set
    #: ``supports_sequence_parallel = True``. When ``sequence_parallel_group`` is a
    #: ``torch.distributed`` process group (set on the instance, e.g. by the ``mad_tasks``
    #: wrapper), ``forward`` takes this rank's time shard of the sequence and its scans run
    #: across the group (``lrnn_scan.distributed.scan``; ``initial_state`` on rank 0 only, the
    #: final recurrent state is the whole sequence's). ``None`` (default): ordinary forward.
    supports_sequence_parallel: bool = False
    sequence_parallel_group = None

    # ------------------------------------------------------------------ public interface
    def forward(self, x: Tensor, state: State | None = None, cu_seqlens: Tensor | None = None):
        """``x`` ``[B, T, d_model]`` -> ``(y [B, T, d_model], final state dict)``.

        ``state``: initial state dict (rows = ``B``, or ``num_seqs`` with ``cu_seqlens``), or None
        for zeros. ``cu_seqlens``: int64 ``(num_seqs + 1,)`` for a packed batch (``B == 1``).
        """
        state, cu_seqlens = self._prepare(x, state, cu_seqlens)
        return self._forward(x, state, cu_seqlens)

    def step(self, x_t: Tensor, state: State | None = None):
        """One token: ``x_t`` ``[B, d_model]`` -> ``(y_t [B, d_model], new state dict)``."""
        self._check_x(x_t, 2, "[B, d_model]")
        state = self._check_state(state, x_t.shape[0], x_t)
        if state is None:
            state = self.init_state(x_t.shape[0], device=x_t.device,
                                    dtype=torch.promote_types(x_t.dtype, torch.float32))
        return self._step(x_t, state)

    def init_state(self, batch_size: int, *, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> State:
        """Zero state for ``batch_size`` rows (dtype: parameters' dtype promoted to float32)."""
        p = next(self.parameters())
        dtype = dtype or torch.promote_types(p.dtype, torch.float32)
        device = device if device is not None else p.device
        return {k: torch.zeros(s, dtype=dtype, device=device)
                for k, s in self.state_shapes(batch_size).items()}

    def state_shapes(self, batch_size: int) -> dict[str, tuple[int, ...]]:  # pragma: no cover
        """Shape of every entry of the state dict for ``batch_size`` rows."""
        raise NotImplementedError

    def flops_per_step(self) -> int:  # pragma: no cover - abstract
        """Hidden-to-hidden FLOPs per token (paper's Table 5)."""
        raise NotImplementedError

    def transition_operator(self, x: Tensor, state: State | None = None,
                            cu_seqlens: Tensor | None = None) -> TransitionOperator:
        """The per-step transition operators ``A_t`` for the input ``x`` ``[B, T, d_model]``."""
        raise NotImplementedError(f"{type(self).__name__} has no linear transition operator")

    @torch.no_grad()
    def transition_spectrum(self, x: Tensor, state: State | None = None,
                            cu_seqlens: Tensor | None = None) -> Tensor:
        """Eigenvalues of the per-step transition blocks for input ``x`` ``[B, T, d_model]``.

        Returns a complex tensor ``(*op.batch_shape, d)`` (e.g. ``(B, T, blocks, m)``); for a
        diagonal transition the diagonal itself ``(B, T, d)``. Eigenvalues are computed in
        float64 (complex128 result).
        """
        state, cu_seqlens = self._prepare(x, state, cu_seqlens)
        op = self.transition_operator(x, state, cu_seqlens)
        if isinstance(op, Diagonal):
            return op.a.to(torch.float64).to(torch.complex128)
        return torch.linalg.eigvals(op.to_dense().to(torch.float64))

    # ------------------------------------------------------------------ validation helpers
    def _prepare(self, x, state, cu_seqlens):
        """Validate a sequence input; return ``(state, cu_seqlens on x's device as int64)``."""
        self._check_x(x, 3, "[B, T, d_model]")
        n = self._check_cu_seqlens(x, cu_seqlens)
        state = self._check_state(state, n, x)
        if cu_seqlens is not None:
            cu_seqlens = cu_seqlens.to(device=x.device, dtype=torch.int64)
        return state, cu_seqlens

    def _check_x(self, x, ndim: int, layout: str) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"{type(self).__name__}: x must be a torch.Tensor {layout}, got "
                            f"{type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__}: x must be floating point, got {x.dtype}")
        if x.dim() != ndim or x.shape[-1] != self.d_model:
            raise ValueError(f"{type(self).__name__}: x must have shape {layout} with d_model="
                             f"{self.d_model}; got {tuple(x.shape)}")

    def _check_cu_seqlens(self, x: Tensor, cu_seqlens) -> int:
        """Number of sequences (rows of the state)."""
        if cu_seqlens is None:
            return x.shape[0]
        if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64) \
                or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must be a 1-D int64 tensor (num_seqs + 1,) of cumulative "
                             f"lengths; got {cu_seqlens!r}")
        if x.shape[0] != 1:
            raise ValueError(f"with cu_seqlens, x must be a packed batch [1, T, d_model]; got "
                             f"{tuple(x.shape)}")
        cs = cu_seqlens.detach().cpu()
        if int(cs[0]) != 0 or int(cs[-1]) != x.shape[1] or bool((cs[1:] < cs[:-1]).any()):
            raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at T="
                             f"{x.shape[1]}; got {cs.tolist()}")
        return cs.numel() - 1

    def _check_state(self, state, rows: int, x: Tensor):
        if state is None:
            return None
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}: state must be a dict of tensors (see "
                            f"init_state), got {type(state).__name__}")
        shapes = self.state_shapes(rows)
        if set(state) != set(shapes):
            raise ValueError(f"{type(self).__name__}: state must have keys {sorted(shapes)}; got "
                             f"{sorted(state)}")
        for k, s in shapes.items():
            t = state[k]
            if not isinstance(t, Tensor) or tuple(t.shape) != tuple(s):
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{type(self).__name__}: state[{k!r}] must have shape {tuple(s)} "
                                 f"(rows = batch size or number of packed sequences); got {got}")
            if t.device != x.device:
                raise ValueError(f"{type(self).__name__}: state[{k!r}] is on {t.device} but x is "
                                 f"on {x.device}")
        return state
