"""A compact Mamba2-style selective diagonal SSM on :func:`lrnn_scan.scan` (baseline)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import lrnn_scan as ls

from .base import RecurrentLayer, State, check_positive_int
from .conv import ShortConv

__all__ = ["Mamba2"]


class Mamba2(RecurrentLayer):
    """Selective diagonal SSM in the style of Mamba2 (one group, scalar decay per head).

    With ``D = d_inner`` channels, state expansion ``S``, ``[x | B | C] = silu(conv(W_in x))``,
    ``dt = softplus(W_dt x + dt_bias)`` per head and decay ``a = exp(−exp(A_log) · dt)``:

        h_t[d, s] = a_t[d] h_{t−1}[d, s] + dt_t[d] · x_t[d] · B_t[s],
        y_t[d] = Σ_s C_t[s] h_t[d, s] + D[d] · x_t[d],   out = out_proj(y_t ⊙ silu(z_t)).

    Args:
        d_model: model width.
        d_inner: ``D`` channels (default ``2 · d_model``).
        state_size: ``S`` state expansion (default 16).
        num_heads: heads sharing one decay (default ``D``: one decay per channel); divides ``D``.
        conv_size: short conv kernel (default 4).
        dt_min, dt_max: range of the initial ``dt`` (default 1e-3, 0.1).

    State: ``{"h": [B, D, S], "conv": [B, conv_size − 1, D + 2S]}``.
    ``flops_per_step() = 2·D·S`` (Table 5's ``2NS``). ``transition_spectrum(x)``: the decays
    ``a_t`` per channel ``(B, T, D)`` (each channel's block is ``a_t · I_S``).
    """

    supports_sequence_parallel = True

    def __init__(self, d_model: int, d_inner: int | None = None, state_size: int = 16,
                 num_heads: int | None = None, *, conv_size: int = 4, dt_min: float = 1e-3,
                 dt_max: float = 0.1):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.d_inner = D = check_positive_int("d_inner", 2 * d_model if d_inner is None else d_inner)
        self.state_size = S = check_positive_int("state_size", state_size)
        self.num_heads = check_positive_int("num_heads", D if num_heads is None else num_heads)
        if D % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_inner={D}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        Hh = self.num_heads
        self.in_proj = nn.Linear(d_model, 2 * D + 2 * S + Hh, bias=False)
        self.conv = ShortConv(D + 2 * S, conv_size, "silu")
        dt = torch.exp(torch.rand(Hh) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))      # softplus^-1(dt)
        self.A_log = nn.Parameter(torch.empty(Hh).uniform_(1, 16).log())
        self.D = nn.Parameter(torch.ones(D))
        self.out_proj = nn.Linear(D, d_model, bias=False)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_inner={self.d_inner}, state_size={self.state_size}, "
                f"num_heads={self.num_heads}")

    def state_shapes(self, batch_size: int):
        return {"h": (batch_size, self.d_inner, self.state_size),
                "conv": (batch_size, self.conv.context, self.conv.channels)}

    def flops_per_step(self) -> int:
        return 2 * self.d_inner * self.state_size

    def _features(self, x: Tensor, conv_fn):
        """``z, xs`` ``[*, D]``, ``Bm, Cm`` ``[*, S]``, ``dt, a`` ``[*, D]``, new conv state."""
        D, S = self.d_inner, self.state_size
        z, xbc, dt = self.in_proj(x).split([D, D + 2 * S, self.num_heads], dim=-1)
        xbc, conv_state = conv_fn(xbc)
        xs, Bm, Cm = xbc.split([D, S, S], dim=-1)
        dt = F.softplus(dt + self.dt_bias)
        a = torch.exp(-self.A_log.exp() * dt)
        rep = D // self.num_heads
        return z, xs, Bm, Cm, dt.repeat_interleave(rep, -1), a.repeat_interleave(rep, -1), conv_state

    def _output(self, h: Tensor, xs, Cm, z, x) -> Tensor:
        y = (h @ Cm.unsqueeze(-1).to(h.dtype)).squeeze(-1).to(x.dtype) + self.D * xs
        return self.out_proj(y * F.silu(z))

    def _forward(self, x: Tensor, state: State | None, cu_seqlens):
        conv0 = None if state is None else state["conv"]
        z, xs, Bm, Cm, dt, a, conv_state = self._features(
            x, lambda t: self.conv(t, conv0, cu_seqlens, group=self.sequence_parallel_group))
        Bsz, T, D, S = *x.shape[:2], self.d_inner, self.state_size
        b = ((dt * xs).unsqueeze(-1) * Bm.unsqueeze(-2)).flatten(-2)         # [B, T, D·S]
        op = ls.Diagonal(a.unsqueeze(-1).expand(Bsz, T, D, S).flatten(-2))
        h0 = None if state is None else state["h"].flatten(-2).to(b.dtype)
        if self.sequence_parallel_group is not None:
            if cu_seqlens is not None:
                raise NotImplementedError("Mamba2: cu_seqlens is not supported in "
                                          "sequence-parallel mode")
            from lrnn_scan import distributed as lsd
            h, h_final = lsd.scan(op, b, initial_state=h0, output_final_state=True,
                                  group=self.sequence_parallel_group)
        else:
            h, h_final = ls.scan(op, b, initial_state=h0, output_final_state=True,
                                 cu_seqlens=cu_seqlens)
        y = self._output(h.unflatten(-1, (D, S)), xs, Cm, z, x)
        return y, {"h": h_final.unflatten(-1, (D, S)), "conv": conv_state}

    def _step(self, x_t: Tensor, state: State):
        z, xs, Bm, Cm, dt, a, conv_state = self._features(
            x_t, lambda t: self.conv.step(t, state["conv"]))
        h = a.unsqueeze(-1) * state["h"] + (dt * xs).unsqueeze(-1) * Bm.unsqueeze(-2)
        return self._output(h, xs, Cm, z, x_t), {"h": h, "conv": conv_state}

    def transition_operator(self, x: Tensor, state: State | None = None, cu_seqlens=None):
        """``Diagonal`` with ``a`` ``(B, T, D)``: the per-channel decay (block ``a·I_S``)."""
        conv0 = None if state is None else state["conv"]
        a = self._features(x, lambda t: self.conv(t, conv0, cu_seqlens))[5]
        return ls.Diagonal(a)
