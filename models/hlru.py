"""H-LRU: higher-order (order ``m``) linear recurrent unit with L1-normalised selective gates."""
from __future__ import annotations

import torch
from torch import Tensor

import lrnn_scan as ls
from lrnn_scan.gates import DEFAULT_EPS, normalize_gates

from .gated_lru import GatedLRU

__all__ = ["HLRU"]


class HLRU(GatedLRU):
    """Higher-order LRU (H-LRU/BD-LRU paper): per channel ``k``,
    ``h_t = Σ_{i=1..m} a_{i,t} h_{t-i} + a_{0,t} v_t``, ``y_t = out_proj(h_t)``.

    Gate logits ``Linear(d_model, N·(m+1))`` reshaped to ``(B, T, N, m+1)`` (index 0: input gate,
    ``i = 1..m``: weight of ``h_{t-i}``), normalised by ``gate``; values ``Linear(d_model, N)``;
    O(m) companion scan :func:`lrnn_scan.hlru_scan`; the output is the newest component.

    Args:
        d_model: model width.
        hidden_size: ``N`` channels (each keeps its last ``m`` values: ``N·m`` state numbers).
        m: order / window size (default 2).
        gate: gate variant (default ``"softmax"``). selective: see :class:`BDLRU`.
        eps: L1 epsilon (default 1e-6). bias: value/output projection biases (default True).

    State: ``{"h": [B, N, m]}``, the shift register ``(h_t, h_{t-1}, …, h_{t-m+1})`` newest first.
    ``flops_per_step() = 2·N·m + 2·N`` (Table 5's ``2Hm + 2H``, ``H`` = channels).
    ``transition_spectrum(x)``: ``(B, T, N, m)`` complex eigenvalues of the companion blocks.
    """

    def __init__(self, d_model: int, hidden_size: int, m: int = 2, gate: str = "softmax", *,
                 selective: bool = True, eps: float = DEFAULT_EPS, bias: bool = True):
        super().__init__(d_model, hidden_size, m, gate, selective=selective, eps=eps, bias=bias)

    def state_shapes(self, batch_size: int):
        return {"h": (batch_size, self.hidden_size, self.m)}

    def flops_per_step(self) -> int:
        return 2 * self.hidden_size * self.m + 2 * self.hidden_size

    def _reshape_logits(self, z: Tensor) -> Tensor:
        return z.unflatten(-1, (self.hidden_size, self.m + 1))

    def _scan(self, z, v, h0, cu_seqlens):
        if self.sequence_parallel_group is not None:    # newest-only input, as in hlru_scan
            a, a0 = normalize_gates(z, self.gate, self.eps)
            return self._sp_scan(ls.Companion(a), a0 * v.to(a0.dtype), h0, cu_seqlens)
        return ls.hlru_scan(z, v, self.gate, eps=self.eps, initial_state=h0,
                            output_final_state=True, cu_seqlens=cu_seqlens)

    def _transition(self, z, v):
        a, a0 = normalize_gates(z, self.gate, self.eps)
        b = a0 * v.to(a0.dtype)
        full = torch.cat([b.unsqueeze(-1), b.new_zeros(*b.shape, self.m - 1)], dim=-1)
        return ls.Companion(a), full

    def _state_readout(self, h: Tensor) -> Tensor:
        return h[..., 0]
