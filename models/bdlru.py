"""BD-LRU: block-diagonal linear recurrent unit with L1-normalised selective gates."""
from __future__ import annotations

from torch import Tensor

import lrnn_scan as ls
from lrnn_scan.gates import DEFAULT_EPS, normalize_gates

from .gated_lru import GatedLRU

__all__ = ["BDLRU"]


class BDLRU(GatedLRU):
    """Block-diagonal LRU (H-LRU/BD-LRU paper): per block ``k`` of size ``m``,
    ``h^k_t = A^k_t h^k_{t-1} + a^k_{0,t} ⊙ v^k_t``, ``y_t = out_proj(h_t)``.

    Gate logits ``Linear(d_model, N·(m+1))`` reshaped to ``(B, T, N/m blocks, m rows, m+1)``
    (row ``i`` of a block: input-gate logit at index 0, its ``m`` transition entries at ``1..m``),
    normalised row-wise by ``gate``; values ``Linear(d_model, N)`` reshaped to
    ``(B, T, N/m, m)``; scan :func:`lrnn_scan.bdlru_scan` (fused Triton kernel on CUDA).

    Args:
        d_model: model width.
        hidden_size: ``N`` state units, a multiple of ``m``.
        m: block size (default 2).
        gate: gate variant (default ``"softmax"``), see :mod:`lrnn_scan.gates`.
        selective: input-dependent gates (default True); False = learned constant gates.
        eps: L1 epsilon (default 1e-6). bias: value/output projection biases (default True).

    State: ``{"h": [B, N/m, m]}``. ``flops_per_step() = 2·H·m² + 2·H`` with ``H = N/m``.
    ``transition_spectrum(x)``: ``(B, T, N/m, m)`` complex eigenvalues of the blocks ``A^k_t``.

    Example:
        >>> import torch
        >>> layer = BDLRU(d_model=16, hidden_size=12, m=3)
        >>> y, state = layer(torch.randn(2, 10, 16))
        >>> y.shape, state["h"].shape
        (torch.Size([2, 10, 16]), torch.Size([2, 4, 3]))
    """

    def __init__(self, d_model: int, hidden_size: int, m: int = 2, gate: str = "softmax", *,
                 selective: bool = True, eps: float = DEFAULT_EPS, bias: bool = True):
        if isinstance(hidden_size, int) and isinstance(m, int) and m >= 1 and hidden_size % m:
            raise ValueError(f"BDLRU: hidden_size N={hidden_size} must be a multiple of the block "
                             f"size m={m}")
        super().__init__(d_model, hidden_size, m, gate, selective=selective, eps=eps, bias=bias)
        self.num_blocks = hidden_size // m

    def state_shapes(self, batch_size: int):
        return {"h": (batch_size, self.num_blocks, self.m)}

    def flops_per_step(self) -> int:
        H, m = self.num_blocks, self.m
        return 2 * H * m * m + 2 * H

    def _reshape_logits(self, z: Tensor) -> Tensor:
        return z.unflatten(-1, (self.num_blocks, self.m, self.m + 1))

    def _reshape_values(self, v: Tensor) -> Tensor:
        return v.unflatten(-1, (self.num_blocks, self.m))

    def _scan(self, z, v, h0, cu_seqlens):
        if self.sequence_parallel_group is not None:
            return self._sp_scan(*self._transition(z, v), h0, cu_seqlens)
        return ls.bdlru_scan(z, v, self.gate, eps=self.eps, initial_state=h0,
                             output_final_state=True, cu_seqlens=cu_seqlens)

    def _transition(self, z, v):
        A, a0 = normalize_gates(z, self.gate, self.eps)
        return ls.BlockDiagonal(A), a0 * v.to(a0.dtype)

    def _readout(self, h: Tensor) -> Tensor:
        return h.flatten(-2)
