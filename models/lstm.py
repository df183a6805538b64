"""LSTM baseline wrapping :class:`torch.nn.LSTM` in the common layer interface."""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .base import RecurrentLayer, State, check_positive_int, packed_layout

__all__ = ["LSTM"]


class LSTM(RecurrentLayer):
    """One-layer LSTM (``torch.nn.LSTM``, cuDNN on GPU) followed by ``Linear(H, d_model)``.

    Args:
        d_model: model width.
        hidden_size: ``H`` (default ``d_model``).
        bias: LSTM and output biases (default True).

    State: ``{"h": [B, H], "c": [B, H]}``. ``cu_seqlens`` runs the packed sequences through
    :func:`~torch.nn.utils.rnn.pack_padded_sequence`. ``flops_per_step() = 8H² + 25H``
    (Table 5). ``transition_spectrum(x)``: the forget gates ``f_t`` ``(B, T, H)`` as a complex
    tensor — the cell-state transition ``∂c_t/∂c_{t−1} = diag(f_t)`` at fixed ``h_{t−1}`` (the LSTM
    has no input-independent linear transition). Under CPU autocast the LSTM itself runs in
    float32 (oneDNN's bf16 LSTM fails on CPUs without AVX-512 BF16); on CUDA, cuDNN's 16-bit one.
    """

    def __init__(self, d_model: int, hidden_size: int | None = None, *, bias: bool = True):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.hidden_size = check_positive_int("hidden_size", d_model if hidden_size is None
                                              else hidden_size)
        self.lstm = nn.LSTM(d_model, self.hidden_size, bias=bias, batch_first=True)
        self.out_proj = nn.Linear(self.hidden_size, d_model, bias=bias)

    def state_shapes(self, batch_size: int):
        return {"h": (batch_size, self.hidden_size), "c": (batch_size, self.hidden_size)}

    def flops_per_step(self) -> int:
        H = self.hidden_size
        return 8 * H * H + 25 * H

    def _hc(self, state, n, x):
        if state is None:
            return None
        p = self.lstm.weight_ih_l0
        return tuple(state[k].to(p.dtype).unsqueeze(0).contiguous() for k in ("h", "c"))

    def _lstm(self, inp, hc):
        """``self.lstm``; under CPU autocast in float32: oneDNN's bf16 LSTM needs AVX-512 (BF16)
        and on other CPUs (AVX2 machines) raises "could not create a primitive descriptor for the
        LSTM forward propagation primitive". On CUDA autocast runs cuDNN's 16-bit LSTM as usual."""
        dev = (inp.data if isinstance(inp, torch.nn.utils.rnn.PackedSequence) else inp).device
        if dev.type == "cpu" and torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                return self.lstm(inp, hc)
        return self.lstm(inp, hc)

    def _forward(self, x: Tensor, state: State | None, cu_seqlens):
        p_dtype = self.lstm.weight_ih_l0.dtype
        hc = self._hc(state, x.shape[0], x)
        if cu_seqlens is None:
            out, (hn, cn) = self._lstm(x.to(p_dtype), hc)
        else:
            cu, seq_of, local = packed_layout(x, cu_seqlens)
            lens = cu[1:] - cu[:-1]
            n, L = lens.numel(), max(int(lens.max()), 1)
            padded = x.new_zeros(n, L, self.d_model, dtype=p_dtype)
            padded[seq_of, local] = x[0].to(p_dtype)
            packed = pack_padded_sequence(padded, lens.clamp(min=1).cpu(), batch_first=True,
                                          enforce_sorted=False)
            out, (hn, cn) = self._lstm(packed, hc)
            out = pad_packed_sequence(out, batch_first=True, total_length=L)[0][seq_of, local][None]
            empty = (lens == 0)[None, :, None]
            if bool(empty.any()):   # an empty sequence keeps its initial state
                h0, c0 = hc if hc is not None else (torch.zeros_like(hn), torch.zeros_like(cn))
                hn, cn = torch.where(empty, h0, hn), torch.where(empty, c0, cn)
        # Under autocast nn.LSTM returns half-precision h/c; recurrent states are kept in (at least)
        # float32 like every other layer's.
        sdt = torch.promote_types(p_dtype, torch.float32)
        # the last layer's (B, H) by reshape, not hn[0]: under torch 2.11's Dynamo (allow_rnn,
        # aot_eager) nn.LSTM's traced h_n had an extra leading dim, and hn[0] came out (1, B, H)
        hn, cn = (v.reshape(-1, *v.shape[-2:])[-1] for v in (hn, cn))
        return self.out_proj(out).to(x.dtype), {"h": hn.to(sdt), "c": cn.to(sdt)}

    def _step(self, x_t: Tensor, state: State):
        y, new = self._forward(x_t.unsqueeze(1), state, None)
        return y[:, 0], new

    @torch.no_grad()
    def transition_spectrum(self, x: Tensor, state: State | None = None,
                            cu_seqlens: Tensor | None = None) -> Tensor:
        """Forget gates ``f_t`` ``(B, T, H)`` (complex); see the class docstring."""
        if cu_seqlens is not None:
            raise ValueError("LSTM.transition_spectrum does not take cu_seqlens; pass [B, T, d]")
        state, _ = self._prepare(x, state, None)
        hc = self._hc(state, x.shape[0], x)
        out, _ = self._lstm(x.to(self.lstm.weight_ih_l0.dtype), hc)
        h0 = hc[0][0] if hc is not None else out.new_zeros(x.shape[0], self.hidden_size)
        h_prev = torch.cat([h0.unsqueeze(1), out[:, :-1]], dim=1)
        pre = x.to(out.dtype) @ self.lstm.weight_ih_l0.T + h_prev @ self.lstm.weight_hh_l0.T
        if self.lstm.bias:
            pre = pre + self.lstm.bias_ih_l0 + self.lstm.bias_hh_l0
        f = torch.sigmoid(pre.chunk(4, dim=-1)[1])                 # gate order i, f, g, o
        return f.to(torch.float64).to(torch.complex128)
