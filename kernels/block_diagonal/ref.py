"""Naive torch references: a step-by-step loop, differentiable by autograd.

Used by the tests (in float64) and by nothing on the fast path.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _bounds(T: int, B: int, cu_seqlens):
    if cu_seqlens is None:
        return [(s * T, s * T + T) for s in range(B)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:]))


def block_diagonal_scan_ref(A: Tensor, b: Tensor, initial_state=None, output_final_state=False,
                            cu_seqlens=None):
    """``h_t = A_t h_{t-1} + b_t`` per block; A ``(B,T,H,m,m)``, b ``(B,T,H,m)``.

    Computes in the dtype of ``b`` (pass float64 tensors for a reference). Returns ``(h, h_final|None)``
    with ``h_final`` of shape ``(B|num_seqs, H, m)``.
    """
    B, T, H, m = b.shape
    Af = A.reshape(B * T, H, m, m)
    bf = b.reshape(B * T, H, m)
    outs, finals = [None] * (B * T), []
    for s, (bos, eos) in enumerate(_bounds(T, B, cu_seqlens)):
        h = (initial_state[s].to(b.dtype) if initial_state is not None
             else torch.zeros(H, m, dtype=b.dtype, device=b.device))
        for t in range(bos, eos):
            h = (Af[t].to(b.dtype) @ h.unsqueeze(-1)).squeeze(-1) + bf[t]
            outs[t] = h
        finals.append(h)
    h = torch.stack(outs, 0).reshape(B, T, H, m) if B * T else b.clone()
    return h, (torch.stack(finals, 0) if output_final_state else None)


def diagonal_scan_ref(a: Tensor, b: Tensor, initial_state=None, output_final_state=False,
                      cu_seqlens=None):
    """``h_t = a_t * h_{t-1} + b_t``; a, b ``(B,T,N)``; ``h_final`` ``(B|num_seqs, N)``."""
    h, hf = block_diagonal_scan_ref(a[..., None, None], b[..., None],
                                    None if initial_state is None else initial_state[..., None],
                                    output_final_state, cu_seqlens)
    return h[..., 0], (hf[..., 0] if hf is not None else None)
