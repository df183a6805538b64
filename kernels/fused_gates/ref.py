"""Naive torch reference for the fused-gate block-diagonal scan (a plain loop; differentiable).

Used by the tests (in fp64) and as the fallback where Triton cannot run (CPU without
``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from lrnn_scan.gates import normalize_gates


def block_scan_ref(A: Tensor, b: Tensor, initial_state=None, output_final_state=False,
                   cu_seqlens=None, dtype=torch.float64):
    """h_t = A_t h_{t-1} + b_t; A (B,T,H,m,m), b (B,T,H,m). Returns (h in b's dtype, h_final fp32)."""
    B, T, H, m = b.shape
    A, bb = A.to(dtype), b.to(dtype)
    bounds = ([(i * T, (i + 1) * T) for i in range(B)] if cu_seqlens is None
              else list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())))
    A = A.reshape(B * T, H, m, m)
    bb = bb.reshape(B * T, H, m)
    outs, finals = [None] * (B * T), []
    for n, (s, e) in enumerate(bounds):
        h = (initial_state[n].to(dtype) if initial_state is not None
             else torch.zeros(H, m, dtype=dtype, device=b.device))
        for t in range(s, e):
            h = (A[t] @ h.unsqueeze(-1)).squeeze(-1) + bb[t]
            outs[t] = h
        finals.append(h)
    h_all = torch.stack(outs).reshape(B, T, H, m).to(b.dtype) if B * T else b.new_zeros(b.shape)
    hf = torch.stack(finals).float() if output_final_state else None
    return h_all, hf


def fused_gate_scan_ref(logits: Tensor, v: Tensor, variant: str = "softmax", eps: float = 1e-6,
                        initial_state=None, output_final_state=False, cu_seqlens=None,
                        dtype=torch.float64):
    """normalize_gates + block_scan_ref; outputs in ``result_type(logits, v)``."""
    A, a0 = normalize_gates(logits.to(dtype), variant, eps)
    out_dtype = torch.promote_types(logits.dtype, v.dtype)
    h, hf = block_scan_ref(A, a0 * v.to(dtype), initial_state, output_final_state, cu_seqlens, dtype)
    return h.to(out_dtype), hf
