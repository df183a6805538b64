"""Token-by-token recurrence for DeltaProduct (the ground truth every fast path is tested against).

``H_t = exp(g_t) Π_j (I − β_{t,j} k k^T) H_{t−1} + B_t`` applied as ``n_h`` sequential delta-rule
sub-steps on the gated state, ``o_t = scale · H_t^T q_t``. Slow (a Python loop over time); run it
in float64 for references.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .layout import token_offsets


def recurrent_delta_product(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None,
                            *, scale: float | None = None, initial_state: Tensor | None = None,
                            output_final_state: bool = False, cu_seqlens: Tensor | None = None,
                            use_qk_l2norm: bool = False):
    """Same arguments and layout as :func:`chunk_delta_product`; computed in ``q``'s dtype."""
    B, T, H, K = q.shape
    n_h, V = k.shape[2], v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm:
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
    cu = token_offsets(B, T, cu_seqlens)
    # packed views: [total, ...]
    qf, kf, vf, bf = q.reshape(B * T, H, K), k.reshape(B * T, n_h, H, K), v.reshape(B * T, n_h, H, V), \
        beta.reshape(B * T, n_h, H)
    gf = g.reshape(B * T, H) if g is not None else None
    outs, finals = [], []
    for n in range(len(cu) - 1):
        S = (initial_state[n].to(q.dtype) if initial_state is not None
             else q.new_zeros(H, K, V))                                   # [H, K, V]
        for t in range(cu[n], cu[n + 1]):
            if gf is not None:
                S = S * gf[t].exp()[:, None, None]
            for j in range(n_h):
                kk, vv, bb = kf[t, j], vf[t, j], bf[t, j]                 # [H,K] [H,V] [H]
                kS = torch.einsum("hk,hkv->hv", kk, S)
                S = S + bb[:, None, None] * kk[:, :, None] * (vv - kS)[:, None, :]
            outs.append(torch.einsum("hk,hkv->hv", qf[t], S) * scale)
        finals.append(S)
    o = torch.stack(outs, 0).reshape(B, T, H, V) if outs else q.new_zeros(B, T, H, V)
    fs = torch.stack(finals, 0) if output_final_state else None
    if fs is not None and fs.dtype != torch.float64:
        fs = fs.float()
    return o, fs
