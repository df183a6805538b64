"""Short causal depthwise convolution with a recurrent state (the q/k/v conv of DeltaNet, Mamba2).

``y_t[c] = act(Σ_{j=0}^{K-1} w[c, K-1-j] · x_{t-j}[c])`` with ``x_{t-j}`` taken from the
convolution state (the last ``K-1`` inputs, oldest first) before the sequence start. With
``cu_seqlens`` every packed sequence starts from its own context (zeros by default): no token
ever sees a token of another sequence.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import check_positive_int, packed_layout

__all__ = ["ShortConv"]


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution over time, ``[B, T, C] -> [B, T, C]``.

    Args:
        channels: ``C``.
        kernel_size: ``K`` (default 4); the state holds the last ``K - 1`` inputs.
        activation: ``"silu"`` (default) or ``None``.

    State: ``[B | num_seqs, K - 1, C]``, oldest input first.
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: str | None = "silu"):
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.kernel_size = check_positive_int("kernel_size (conv_size)", kernel_size)
        if activation not in ("silu", None):
            raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
        self.activation = activation
        bound = 1.0 / math.sqrt(kernel_size)           # nn.Conv1d's default for a depthwise conv
        self.weight = nn.Parameter(torch.empty(channels, kernel_size).uniform_(-bound, bound))

    @property
    def context(self) -> int:
        return self.kernel_size - 1

    def _act(self, y: Tensor) -> Tensor:
        return F.silu(y) if self.activation == "silu" else y

    def forward(self, x: Tensor, state: Tensor | None = None, cu_seqlens: Tensor | None = None,
                *, group=None):
        """``x`` ``[B, T, C]``, ``state`` ``[B | num_seqs, K-1, C]`` or None -> ``(y, new_state)``.

        ``group`` (a ``torch.distributed`` process group): sequence-parallel mode, ``x`` is this
        rank's time shard; the context before it comes from the earlier ranks
        (:func:`lrnn_scan.distributed.halo`), ``state`` is read on rank 0 only, and the returned
        state is this shard's (the last rank's is the whole sequence's).
        """
        B, T, C = x.shape
        W = self.context
        n = B if cu_seqlens is None else cu_seqlens.numel() - 1
        if group is not None:
            if cu_seqlens is not None:
                raise NotImplementedError("ShortConv: cu_seqlens is not supported in "
                                          "sequence-parallel mode")
            import torch.distributed as dist

            from lrnn_scan import distributed as lsd
            ctx = lsd.halo(x, W, group=group)                   # collective: every rank calls it
            if state is None or dist.get_rank(group) != 0:
                state = ctx
        if state is None:
            state = x.new_zeros(n, W, C)
        state = state.to(x.dtype)
        if cu_seqlens is None:
            xp = torch.cat([state, x], dim=1)                                  # [B, W+T, C]
            # One depthwise conv1d (cross-correlation: y_t = Σ_j w[:, j] x_{t+j-W}) instead of
            # K shifted products: on CUDA the latter cost ~10 elementwise passes and their
            # slice backwards (the bulk of a GatedDeltaNet layer's time in bf16, profiled).
            y = F.conv1d(xp.transpose(1, 2), self.weight.to(x.dtype).unsqueeze(1),
                         groups=C).transpose(1, 2)                             # [B, T, C]
            return self._act(y), xp[:, xp.shape[1] - W:]
        # Packed: gather each token's window, falling back to the sequence's own context.
        cu, seq_of, local = packed_layout(x, cu_seqlens)
        total = x.shape[1]
        src = torch.cat([x[0], state.reshape(n * W, C)], dim=0)

        def index(pos: Tensor, seq: Tensor, tok: Tensor) -> Tensor:
            # pos: position inside the sequence (may be negative -> context row W + pos)
            return torch.where(pos >= 0, tok, total + seq * W + (W + pos).clamp(min=0))

        lags = torch.arange(self.kernel_size, device=x.device)
        pos = local[:, None] - lags.flip(0)[None, :]                          # oldest first
        idx = index(pos, seq_of[:, None], torch.arange(total, device=x.device)[:, None]
                    - lags.flip(0)[None, :])
        win = src[idx]                                                         # [total, K, C]
        y = (win * self.weight.t().to(x.dtype)).sum(1)
        lens = cu[1:] - cu[:-1]
        fpos = lens[:, None] - W + torch.arange(W, device=x.device)[None, :]   # [n, W]
        seqs = torch.arange(n, device=x.device)[:, None]
        new_state = src[index(fpos, seqs, cu[:-1, None] + fpos)]
        return self._act(y).unsqueeze(0), new_state

    def step(self, x_t: Tensor, state: Tensor):
        """``x_t`` ``[B, C]``, ``state`` ``[B, K-1, C]`` -> ``(y_t [B, C], new_state)``."""
        win = torch.cat([state.to(x_t.dtype), x_t.unsqueeze(1)], dim=1)        # [B, K, C]
        y = (win * self.weight.t().to(x_t.dtype)).sum(1)
        return self._act(y), win[:, 1:]
