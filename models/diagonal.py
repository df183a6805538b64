"""Diagonal LRU: the ``m = 1`` case of BD-LRU / H-LRU as its own small layer."""
from __future__ import annotations

from torch import Tensor

import lrnn_scan as ls
from lrnn_scan.gates import DEFAULT_EPS, normalize_gates

from .gated_lru import GatedLRU

__all__ = ["DiagonalLRU"]


class DiagonalLRU(GatedLRU):
    """``h_t = a_t ⊙ h_{t-1} + a_{0,t} ⊙ v_t`` with ``(a_0, a)`` the L1-normalised pair of logits.

    Gate logits ``Linear(d_model, 2N)`` reshaped to ``(B, T, N, 2)`` (index 0 input gate, 1 decay);
    with softmax gates ``a_0 = 1 − a``, the GRU-like form the paper recommends for ``m = 1``.
    Scan: :func:`lrnn_scan.scan` with a :class:`~lrnn_scan.Diagonal` operator (Triton diagonal
    kernel on CUDA). Same parameters and results as ``BDLRU(m=1)`` and ``HLRU(m=1)``.

    Args:
        d_model: model width. hidden_size: ``N`` channels.
        gate: gate variant (default ``"softmax"``). selective: see :class:`BDLRU`.
        eps: L1 epsilon (default 1e-6). bias: value/output projection biases (default True).

    State: ``{"h": [B, N]}``. ``flops_per_step() = 4N`` (Table 5 with ``m = 1``).
    ``transition_spectrum(x)``: the decays ``a_t`` ``(B, T, N)`` as a complex tensor.
    """

    def __init__(self, d_model: int, hidden_size: int, gate: str = "softmax", *,
                 selective: bool = True, eps: float = DEFAULT_EPS, bias: bool = True):
        super().__init__(d_model, hidden_size, 1, gate, selective=selective, eps=eps, bias=bias)

    def state_shapes(self, batch_size: int):
        return {"h": (batch_size, self.hidden_size)}

    def flops_per_step(self) -> int:
        return 4 * self.hidden_size

    def _reshape_logits(self, z: Tensor) -> Tensor:
        return z.unflatten(-1, (self.hidden_size, 2))

    def _transition(self, z, v):
        a, a0 = normalize_gates(z, self.gate, self.eps)
        return ls.Diagonal(a[..., 0].contiguous()), a0 * v.to(a0.dtype)

    def _scan(self, z, v, h0, cu_seqlens):
        op, b = self._transition(z, v)
        if self.sequence_parallel_group is not None:
            return self._sp_scan(op, b, h0, cu_seqlens)
        return ls.scan(op, b, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
