"""Naive torch reference for the companion (H-LRU) scan: a plain loop, differentiable."""
from __future__ import annotations

import torch
from torch import Tensor

from lrnn_scan.gates import normalize_gates


def companion_scan_coeffs_ref(a: Tensor, b: Tensor, initial_state=None, output_final_state=False,
                              cu_seqlens=None, dtype=torch.float64):
    """h_t = Σ_{i=1..m} a[t, i-1] h_{t-i} + b_t; a (B,T,N,m), b (B,T,N); states (·, N, m) newest
    first. Returns (h in result_type(a, b), h_final fp32 or None)."""
    B, T, N, m = a.shape
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    aa, bb = a.to(dtype).reshape(B * T, N, m), b.to(dtype).reshape(B * T, N)
    bounds = ([(i * T, (i + 1) * T) for i in range(B)] if cu_seqlens is None
              else list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())))
    outs, finals = [None] * (B * T), []
    for n, (s, e) in enumerate(bounds):
        st = (initial_state[n].to(dtype) if initial_state is not None
              else torch.zeros(N, m, dtype=dtype, device=b.device))
        for t in range(s, e):
            y = (aa[t] * st).sum(-1) + bb[t]
            st = torch.cat([y[:, None], st[:, :-1]], dim=-1)
            outs[t] = y
        finals.append(st)
    h = torch.stack(outs).reshape(B, T, N).to(out_dtype) if B * T else b.new_zeros(b.shape, dtype=out_dtype)
    hf = torch.stack(finals).float() if output_final_state else None
    return h, hf


def companion_scan_ref(logits: Tensor, v: Tensor, variant="softmax", eps=1e-6, initial_state=None,
                       output_final_state=False, cu_seqlens=None, dtype=torch.float64):
    """normalize_gates on each channel's row (a0 = index 0, a_1..a_m = 1..m), then the loop."""
    a, a0 = normalize_gates(logits.to(dtype), variant, eps)
    h, hf = companion_scan_coeffs_ref(a, a0 * v.to(dtype), initial_state, output_final_state,
                                      cu_seqlens, dtype)
    return h.to(torch.promote_types(logits.dtype, v.dtype)), hf
