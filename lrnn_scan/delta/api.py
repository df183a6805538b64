"""Public entry point ``chunk_delta_product`` (fla-compatible arguments) and backend dispatch."""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _kernel_modules as _km
from ._checks import check_inputs
from ._kernels import load_kernels
from .chunk_torch import chunk_delta_product_torch


def _triton_impl():
    return load_kernels().chunk_delta_product_triton


def chunk_delta_product(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None, *,
                        scale: float | None = None, initial_state: Tensor | None = None,
                        output_final_state: bool = False, cu_seqlens: Tensor | None = None,
                        use_qk_l2norm: bool = False, chunk_size: int = 64, backend: str = "auto"):
    """DeltaProduct / (gated) DeltaNet with ``n_h`` Householder steps per token, chunkwise.

    ``H_t = exp(g_t) (I − β_{t,n} k_{t,n} k_{t,n}^T) ⋯ (I − β_{t,1} k_{t,1} k_{t,1}^T) H_{t−1} + B_t``,
    ``B_t = Σ_j (Π_{l>j} (I − β_{t,l} k k^T)) β_{t,j} k_{t,j} v_{t,j}^T``, ``o_t = scale · H_t^T q_t``,
    ``H`` of shape ``[K, V]`` per head (fla's layout).

    Args:
        q: ``[B, T, H, K]``. k: ``[B, T, n_h, H, K]`` (unit L2 norm, or ``use_qk_l2norm=True``).
        v: ``[B, T, n_h, H, V]``. beta: ``[B, T, n_h, H]`` in ``[0, 2]`` (``> 1``: negative eigenvalues).
        g: optional log-gate ``[B, T, H]`` (``≤ 0``), decay ``exp(g_t)`` of the state before token t.
        scale: read-out scale, default ``K ** -0.5``.
        initial_state: ``[B or num_seqs, H, K, V]`` (used in float32; float64 inputs keep float64).
        output_final_state: also return the final state (float32; float64 for float64 inputs).
        cu_seqlens: int64 ``(num_seqs + 1,)`` token offsets of packed sequences (``B == 1``).
        use_qk_l2norm: L2-normalise q and k along the head dim first (differentiably).
        chunk_size: sub-steps per chunk (``n_h`` sub-steps per token), default 64.
        backend: ``"torch"``, ``"triton"`` (CUDA, or ``TRITON_INTERPRET=1``) or ``"auto"``
            (Triton on CUDA for 16-bit/32-bit inputs when ``chunk_size`` is a power of two
            >= 16, torch otherwise).

    Returns:
        ``(o, final_state)`` with ``o`` ``[B, T, H, V]`` in ``q``'s dtype and ``final_state`` or None.
    """
    B, T, n_h, H, K, V, N = check_inputs(q, k, v, beta, g, scale, initial_state, cu_seqlens,
                                         chunk_size, backend)
    scale = float(K ** -0.5 if scale is None else scale)
    if use_qk_l2norm:
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
    if backend == "auto":
        # The Triton kernels tile chunks as powers of two >= 16; other sizes take the torch path.
        triton_chunk = chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0
        use_triton = _km.kernel_device(q.device) and q.dtype != torch.float64 and triton_chunk
        backend = "triton" if use_triton else "torch"
    if backend == "triton":
        return _triton_impl()(q, k, v, beta, g, scale, initial_state, output_final_state,
                              cu_seqlens, chunk_size)
    return chunk_delta_product_torch(q, k, v, beta, g, scale, initial_state, output_final_state,
                                     cu_seqlens, chunk_size)
