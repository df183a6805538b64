"""Chunkwise WY/UT DeltaProduct in plain torch (CPU or GPU, any float dtype, autograd backward).

Over the interleaved sub-step sequence (``layout.py``), per chunk of ``C`` sub-steps with keys
``K``, values ``V``, step sizes ``β``, chunk-local cumulative log-gate ``G`` (``γ = exp(G)``,
``Γ_rs = exp(G_r − G_s)``, ``r ≥ s``) and state ``H`` at the chunk start
(``shared/reference/math.md`` §6, gated form, errata corrected)::

    A  = (I + strictLower(diag(β) (Γ ⊙ K K^T)))^{-1}
    W  = A diag(β γ) K,   U = A diag(β) V,   Vn = U − W H
    O  = diag(γ) Q H + ((Q K^T) ⊙ Γ ⊙ M) Vn          (M: causal mask with the diagonal)
    H' = γ_C H + (diag(γ_C / γ) K)^T Vn

The intra-chunk work is batched over all chunks; only the state recurrence loops over chunks.
Internally computed in float32 (float64 when the inputs are float64).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .layout import padded_gather, token_offsets


def _gather(x: Tensor, idx: Tensor, mask: Tensor) -> Tensor:
    """``x[idx] * mask`` with ``x`` packed ``[L, ...]`` and ``idx, mask`` of shape ``[N, P]``."""
    y = x[idx.reshape(-1)].reshape(*idx.shape, *x.shape[1:])
    m = mask.reshape(*mask.shape, *([1] * (x.dim() - 1)))
    return torch.where(m, y, torch.zeros((), dtype=y.dtype, device=y.device))


def chunk_delta_product_torch(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
                              scale: float, initial_state: Tensor | None, output_final_state: bool,
                              cu_seqlens: Tensor | None, chunk_size: int):
    """Inputs already validated (see :func:`lrnn_scan.delta.chunk_delta_product`)."""
    B, T, H, K = q.shape
    n_h, V = k.shape[2], v.shape[-1]
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    C = chunk_size
    cu = token_offsets(B, T, cu_seqlens)
    lay = padded_gather(cu, n_h, C, q.device)
    N, P = lay["N"], lay["P"]
    NC = P // C
    ks = _gather(k.reshape(B * T * n_h, H, K).to(cdt), lay["sub"], lay["valid"])      # [N,P,H,K]
    vs = _gather(v.reshape(B * T * n_h, H, V).to(cdt), lay["sub"], lay["valid"])
    bs = _gather(beta.reshape(B * T * n_h, H).to(cdt), lay["sub"], lay["valid"])      # [N,P,H]
    qs = _gather(q.reshape(B * T, H, K).to(cdt), lay["tok"], lay["q_mask"]) * scale
    # [N, H, NC, C, ...]
    def ch(x):
        if x.dim() == 4:
            return x.reshape(N, NC, C, H, x.shape[-1]).permute(0, 3, 1, 2, 4)
        return x.reshape(N, NC, C, H).permute(0, 3, 1, 2)

    kc, vc, bc, qc = ch(ks), ch(vs), ch(bs), ch(qs)
    idx = torch.arange(C, device=q.device)
    strict = idx[:, None] > idx[None, :]
    causal = idx[:, None] >= idx[None, :]
    kk = kc @ kc.transpose(-1, -2)                                                    # [N,H,NC,C,C]
    if g is not None:
        gs = _gather(g.reshape(B * T, H).to(cdt), lay["tok"], lay["g_mask"])
        G = ch(gs).cumsum(-1)                                                          # [N,H,NC,C]
        diff = G[..., :, None] - G[..., None, :]
        Gam = torch.where(causal, diff, torch.full_like(diff, float("-inf"))).exp()
        gam = G.exp()
        gC = G[..., -1:]                                                               # [N,H,NC,1]
        kdec = (gC - G).exp()[..., None] * kc
    else:
        Gam = causal.to(cdt)
        gam = torch.ones_like(bc)
        gC = None
        kdec = kc
    Lm = torch.where(strict, bc[..., :, None] * Gam * kk, torch.zeros((), dtype=cdt, device=q.device))
    eye = torch.eye(C, dtype=cdt, device=q.device)
    Ainv = torch.linalg.solve_triangular(eye + Lm, eye.expand_as(Lm), upper=False, unitriangular=True)
    W = Ainv @ ((bc * gam)[..., None] * kc)
    U = Ainv @ (bc[..., None] * vc)
    Aqk = (qc @ kc.transpose(-1, -2)) * Gam                                           # causal incl. diag
    S = (initial_state.to(cdt) if initial_state is not None
         else torch.zeros(N, H, K, V, dtype=cdt, device=q.device))
    outs = []
    for c in range(NC):
        vn = U[:, :, c] - W[:, :, c] @ S
        qh = (gam[:, :, c, :, None] * qc[:, :, c]) @ S
        outs.append(qh + Aqk[:, :, c] @ vn)
        decay = gC[:, :, c, :, None].exp() if gC is not None else 1.0
        S = decay * S + kdec[:, :, c].transpose(-1, -2) @ vn
    o = torch.stack(outs, 2)                                                          # [N,H,NC,C,V]
    o = o.permute(0, 2, 3, 1, 4).reshape(N * P, H, V)[lay["out_pos"]]
    o = o.reshape(B, T, H, V).to(q.dtype)
    return o, (S if output_final_state else None)
