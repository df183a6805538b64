"""Shared machinery of the L1-normalised gated LRUs (BD-LRU, H-LRU, diagonal LRU).

All three read one input projection of gate logits ``Linear(d_model, N·(m+1))`` (or, for the
non-selective ablation of the paper's App. F, a learned parameter of the same size that does not
depend on the input), one value projection ``Linear(d_model, N)`` and one output projection
``Linear(N, d_model)``. The logits are normalised row-wise by a gate variant of
:mod:`lrnn_scan.gates` (index 0 of each row of ``m + 1`` is the input gate ``a0``). With the same
parameters and ``m = 1`` the three layers compute the same function (the logits layout is the
same: channel-major, then ``m + 1``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lrnn_scan.gates import DEFAULT_EPS, canonical_gate_name, normalize_gates

from .base import RecurrentLayer, State, check_positive_int

__all__ = ["GatedLRU"]


class GatedLRU(RecurrentLayer):
    """Base of :class:`BDLRU`, :class:`HLRU` and :class:`DiagonalLRU` (not used directly).

    Args:
        d_model: model width (input and output features).
        hidden_size: ``N``, number of state channels / rows.
        m: block size (BD-LRU) or order (H-LRU); 1 for the diagonal LRU.
        gate: gate variant of :mod:`lrnn_scan.gates` (``"softmax"`` default; ``sigmoid``, ``relu``,
            ``tanh``, ``identity``, ``none`` and aliases such as ``exp``).
        selective: gate logits from ``Linear(d_model, N·(m+1))`` (True, default) or a learned
            input-independent parameter ``(N·(m+1),)`` (False; the paper's App. F ablation).
        eps: L1-denominator epsilon of the ``relu``/``tanh``/``identity`` variants (1e-6).
        bias: biases in the value and output projections (the gate projection always has one).

    Subclasses provide the logits layout (:meth:`_reshape_logits`), the parallel scan
    (:meth:`_scan`), the one-step operator (:meth:`_transition`) and the read-outs.
    """

    supports_sequence_parallel = True

    def __init__(self, d_model: int, hidden_size: int, m: int = 1, gate: str = "softmax", *,
                 selective: bool = True, eps: float = DEFAULT_EPS, bias: bool = True):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.m = check_positive_int("m", m)
        self.gate = canonical_gate_name(gate)
        if not (isinstance(eps, (int, float)) and eps > 0):
            raise ValueError(f"eps must be a positive float, got {eps!r}")
        self.eps = float(eps)
        self.selective = bool(selective)
        n_logits = hidden_size * (m + 1)
        if self.selective:
            self.gate_proj = nn.Linear(d_model, n_logits)
        else:
            bound = 1.0 / math.sqrt(d_model)
            self.gate_logits = nn.Parameter(torch.empty(n_logits).uniform_(-bound, bound))
        self.value_proj = nn.Linear(d_model, hidden_size, bias=bias)
        self.out_proj = nn.Linear(hidden_size, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, hidden_size={self.hidden_size}, m={self.m}, "
                f"gate={self.gate!r}, selective={self.selective}")

    # ------------------------------------------------------------------ pieces
    def logits(self, x: Tensor) -> Tensor:
        """Raw gate logits ``(*x.shape[:-1], N·(m+1))`` (input-independent if not selective)."""
        if self.selective:
            return self.gate_proj(x)
        return self.gate_logits.to(x.dtype).expand(*x.shape[:-1], -1)

    def values(self, x: Tensor) -> Tensor:
        """Values ``v = value_proj(x)``, ``(*x.shape[:-1], N)``."""
        return self.value_proj(x)

    def _reshape_logits(self, z: Tensor) -> Tensor:  # pragma: no cover - abstract
        """``(*lead, N·(m+1))`` -> the layout the scan expects (``(*lead, ..., m + 1)``)."""
        raise NotImplementedError

    def _reshape_values(self, v: Tensor) -> Tensor:
        return v

    def _scan(self, z: Tensor, v: Tensor, h0, cu_seqlens):  # pragma: no cover - abstract
        """Parallel scan: ``(h over time, final state)``."""
        raise NotImplementedError

    def _transition(self, z: Tensor, v: Tensor):  # pragma: no cover - abstract
        """``(op, b)``: the transition operator and scan input for reshaped logits/values."""
        raise NotImplementedError

    def _readout(self, h: Tensor) -> Tensor:
        """Scan output / state -> ``(*lead, N)`` features for ``out_proj``."""
        return h

    def _sp_scan(self, op, b: Tensor, h0, cu_seqlens):
        """The sequence-parallel scan of ``(op, b)`` over :attr:`sequence_parallel_group`."""
        if cu_seqlens is not None:
            raise NotImplementedError(f"{type(self).__name__}: cu_seqlens is not supported in "
                                      "sequence-parallel mode")
        from lrnn_scan import distributed as lsd
        return lsd.scan(op, b, initial_state=h0, output_final_state=True,
                        group=self.sequence_parallel_group)

    # ------------------------------------------------------------------ interface
    def _forward(self, x: Tensor, state: State | None, cu_seqlens):
        z = self._reshape_logits(self.logits(x))
        v = self._reshape_values(self.values(x))
        h, h_final = self._scan(z, v, None if state is None else state["h"], cu_seqlens)
        y = self.out_proj(self._readout(h).to(x.dtype))
        return y, {"h": h_final}

    def _step(self, x_t: Tensor, state: State):
        op, b = self._transition(self._reshape_logits(self.logits(x_t)),
                                 self._reshape_values(self.values(x_t)))   # batch (B, ...)
        cdt = torch.promote_types(b.dtype, state["h"].dtype)     # keep a float32 state float32
        h = op.map(lambda t: t.to(cdt)).apply(state["h"].to(cdt)) + b.to(cdt)
        return self.out_proj(self._state_readout(h).to(x_t.dtype)), {"h": h}

    def _state_readout(self, h: Tensor) -> Tensor:
        """State -> output features (default: :meth:`_readout`)."""
        return self._readout(h)

    def transition_operator(self, x: Tensor, state: State | None = None, cu_seqlens=None):
        """Per-step transitions for ``x`` ``[B, T, d_model]`` (``state``/``cu_seqlens`` unused)."""
        z = self._reshape_logits(self.logits(x))
        return self._transition(z, self._reshape_values(self.values(x)))[0]

    def normalized_gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(A, a0)`` of :func:`lrnn_scan.gates.normalize_gates` for ``x`` ``[B, T, d_model]``."""
        return normalize_gates(self._reshape_logits(self.logits(x)), self.gate, self.eps)
