"""Interleaving and variable-length layout shared by the torch and Triton paths.

The DeltaProduct recurrence with ``n_h`` Householder steps per token is a gated delta rule over the
*interleaved* sequence of ``n_h·T`` sub-steps (``shared/reference/math.md`` §6): sub-step
``s = t·n_h + j`` has key ``k[t, j]``, value ``v[t, j]``, step size ``β[t, j]``; the token's log-gate
``g_t`` sits on its first sub-step (``j = 0``) and its query is read at its last (``j = n_h − 1``).
``k`` of shape ``[B, T, n_h, H, K]`` is already interleaved in memory: ``k.reshape(B, T·n_h, H, K)``.

Batches without ``cu_seqlens`` are handled as ``B`` packed sequences of equal length, so every path
works on one packed layout with sequence boundaries ``cu = [0, T, 2T, …]`` (tokens).
"""
from __future__ import annotations

import torch
from torch import Tensor


def token_offsets(B: int, T: int, cu_seqlens: Tensor | None) -> list[int]:
    """Token offsets ``[0, …, total]`` of the packed sequences (host list; one sync for varlen)."""
    if cu_seqlens is None:
        return [b * T for b in range(B + 1)]
    return [int(x) for x in cu_seqlens.detach().cpu().tolist()]


def padded_gather(cu: list[int], n_h: int, chunk: int, device) -> dict:
    """Index maps from the packed sub-step array to a ``[N, P]`` layout padded per sequence.

    ``P`` is the longest sequence's sub-step count rounded up to a multiple of ``chunk``. Padding
    sub-steps get ``k = v = β = g = 0`` (the identity step), so they do not change the state.
    """
    N = len(cu) - 1
    lens_list = [cu[i + 1] - cu[i] for i in range(N)]
    lens = torch.tensor(lens_list, dtype=torch.long)
    # Sizes come from the Python list, never from a tensor: no data-dependent bound for Dynamo.
    L = max(lens_list) * n_h if N else 0
    P = max(chunk, -(-L // chunk) * chunk)
    p = torch.arange(P)
    starts = torch.tensor(cu[:-1], dtype=torch.long)
    valid = p[None, :] < (lens[:, None] * n_h)                       # [N, P]
    sub = starts[:, None] * n_h + p[None, :]                          # packed sub-step index
    tok = sub // n_h
    j = p % n_h
    sub = torch.where(valid, sub, torch.zeros_like(sub))
    tok = torch.where(valid, tok, torch.zeros_like(tok))
    out = {
        "N": N, "P": P,
        "sub": sub.to(device), "valid": valid.to(device),
        "tok": tok.to(device),
        "q_mask": (valid & (j[None, :] == n_h - 1)).to(device),
        "g_mask": (valid & (j[None, :] == 0)).to(device),
    }
    # flat position (in [N*P]) of each packed token's last sub-step, for reading outputs
    tok_n = torch.repeat_interleave(torch.arange(N), lens, output_size=sum(lens_list))
    tok_local = torch.arange(sum(lens_list)) - starts[tok_n] if N else torch.zeros(0, dtype=torch.long)
    out["out_pos"] = (tok_n * P + tok_local * n_h + n_h - 1).to(device)
    return out
