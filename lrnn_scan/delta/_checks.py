"""Argument validation for the delta-product API (clear errors naming the argument)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _tensor(name: str, t, ndim: int, layout: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got {tuple(t.shape)}")
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")


def check_inputs(q, k, v, beta, g, scale, initial_state, cu_seqlens, chunk_size, backend):
    """Validate shapes/dtypes/devices; return ``(B, T, n_h, H, K, V, num_seqs)``."""
    _tensor("q", q, 4, "[B, T, H, K]")
    _tensor("k", k, 5, "[B, T, n_h, H, K]")
    _tensor("v", v, 5, "[B, T, n_h, H, V]")
    _tensor("beta", beta, 4, "[B, T, n_h, H]")
    B, T, H, K = q.shape
    if k.shape[:2] != (B, T) or k.shape[3:] != (H, K):
        raise ValueError(f"k must have shape [B, T, n_h, H, K] = [{B}, {T}, n_h, {H}, {K}] to match q "
                         f"{tuple(q.shape)}; got {tuple(k.shape)}")
    n_h = k.shape[2]
    if n_h < 1:
        raise ValueError(f"k: n_h (dim 2) must be >= 1, got {tuple(k.shape)}")
    if v.shape[:4] != (B, T, n_h, H):
        raise ValueError(f"v must have shape [B, T, n_h, H, V] = [{B}, {T}, {n_h}, {H}, V]; "
                         f"got {tuple(v.shape)}")
    if tuple(beta.shape) != (B, T, n_h, H):
        raise ValueError(f"beta must have shape [B, T, n_h, H] = {[B, T, n_h, H]}; got {tuple(beta.shape)}")
    V = v.shape[-1]
    if K < 1 or V < 1:
        raise ValueError(f"q/k head dim K and v head dim V must be >= 1; got K={K}, V={V}")
    for name, t in (("k", k), ("v", v), ("beta", beta)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if g is not None:
        _tensor("g", g, 3, "[B, T, H]")
        if tuple(g.shape) != (B, T, H):
            raise ValueError(f"g must have shape [B, T, H] = {[B, T, H]}; got {tuple(g.shape)}")
        if g.device != q.device:
            raise ValueError(f"g is on {g.device} but q is on {q.device}")
    if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)):
        raise TypeError(f"scale must be a Python float or None, got {type(scale).__name__}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    num_seqs = B
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, Tensor):
            raise TypeError(f"cu_seqlens must be a torch.Tensor (int64), got {type(cu_seqlens).__name__}")
        if cu_seqlens.dtype not in (torch.int64, torch.int32) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must be a 1-D int64 tensor of shape (num_seqs + 1,); got "
                             f"dtype {cu_seqlens.dtype}, shape {tuple(cu_seqlens.shape)}")
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1 (sequences packed along T); got B={B}")
        cs = cu_seqlens.detach().cpu()
        if cs[0].item() != 0 or cs[-1].item() != T or bool((cs[1:] < cs[:-1]).any()):
            raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T={T}; got {cs.tolist()}")
        num_seqs = cu_seqlens.numel() - 1
    if initial_state is not None:
        if not isinstance(initial_state, Tensor):
            raise TypeError(f"initial_state must be a torch.Tensor, got {type(initial_state).__name__}")
        if tuple(initial_state.shape) != (num_seqs, H, K, V):
            raise ValueError(f"initial_state must have shape [num_seqs or B, H, K, V] = "
                             f"{[num_seqs, H, K, V]}; got {tuple(initial_state.shape)}")
        if initial_state.device != q.device:
            raise ValueError(f"initial_state is on {initial_state.device} but q is on {q.device}")
    return B, T, n_h, H, K, V, num_seqs


def check_values(q, k, v, beta, g, initial_state, keys_normalized: bool) -> None:
    """The value checks of ``chunk_delta_product(check_values=True)`` (a few device syncs): finite
    inputs, ``beta`` in ``[0, 2]``, ``g <= 0``, unit keys (unless the call normalises them)."""
    named = [("q", q), ("k", k), ("v", v), ("beta", beta), ("g", g), ("initial_state", initial_state)]
    for name, t in named:
        if t is not None and t.numel() and not bool(torch.isfinite(t.detach()).all()):
            bad = int((~torch.isfinite(t.detach())).sum())
            raise ValueError(f"{name} has {bad} non-finite value(s) (NaN or inf)")
    if beta.numel():
        lo, hi = beta.detach().min().item(), beta.detach().max().item()
        if not (lo >= 0 and hi <= 2):
            raise ValueError(f"beta must lie in [0, 2]; got values in [{lo:.4g}, {hi:.4g}]")
    if g is not None and g.numel() and g.detach().max().item() > 0:
        raise ValueError(f"g is a log-gate and must be <= 0; got a maximum of {g.detach().max().item():.4g}")
    if not keys_normalized and k.numel():
        tol = 1e-2 if k.dtype in (torch.float16, torch.bfloat16) else 1e-4
        err = (k.detach().float().norm(dim=-1) - 1).abs().max().item()
        if not err <= tol:
            raise ValueError(f"k must have unit L2 norm along the head dim (max |‖k‖−1| = {err:.3g}); "
                             "pass use_qk_l2norm=True to normalise q and k")
