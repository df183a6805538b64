"""Public entry point ``chunk_delta_product`` (fla-compatible arguments) and backend dispatch."""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _kernel_modules as _km
from ._checks import check_inputs, check_values as _check_values
from ._kernels import load_kernels
from .chunk_torch import chunk_delta_product_torch


def _triton_impl():
    return load_kernels().chunk_delta_product_triton


def l2_normalize(x: Tensor, eps: float = 1e-12) -> Tensor:
    """``x / max(‖x‖₂, eps)`` along the last dim, returned in ``x``'s dtype (sums in float32).

    ``x``: ``(*, K)``. On CUDA one fused Triton pass forward and one backward
    (:mod:`lrnn_scan.kernels.l2norm`); elsewhere ``torch.nn.functional.normalize`` computed in
    float32 (float64 kept). Under autocast ``F.normalize`` alone would return float32; keeping
    the 16-bit dtype is what the delta kernels' exact 16-bit dots want.
    """
    if _km.kernel_device(x.device):
        return _km.kernel_module("l2norm").l2_normalize(x, eps)
    work = x if x.dtype == torch.float64 else x.float()
    return torch.nn.functional.normalize(work, dim=-1, eps=eps).to(x.dtype)


def chunk_delta_product(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None, *,
                        scale: float | None = None, initial_state: Tensor | None = None,
                        output_final_state: bool = False, cu_seqlens: Tensor | None = None,
                        use_qk_l2norm: bool = False, chunk_size: int = 64, backend: str = "auto",
                        check_values: bool = False):
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
        use_qk_l2norm: L2-normalise q and k along the head dim first (differentiably; fused
            Triton kernels on CUDA, :func:`l2_normalize`).
        chunk_size: sub-steps per chunk (``n_h`` sub-steps per token), default 64.
        backend: ``"torch"``, ``"triton"`` (CUDA, or ``TRITON_INTERPRET=1``) or ``"auto"``
            (Triton on CUDA for 16-bit/32-bit inputs when ``chunk_size`` is a power of two
            >= 16, torch otherwise).
            Triton precision: the state and accumulations are float32. For float32 inputs the
            kernels' dots take three TF32 products each (about fp32 accuracy: relative errors
            near 1e-6 against float64 on an H200), or one TF32 product when
            ``torch.backends.cuda.matmul.allow_tf32`` is on, like torch's own matmuls; exact
            fp32 dots, much slower, with
            ``lrnn_scan.kernels.delta_product.function.TUNE["fp32_dot"] = "ieee"``.
        check_values: also check the values (a few device syncs, so off by default, as in fla): finite
            inputs, ``beta`` in ``[0, 2]``, ``g <= 0`` and unit keys unless ``use_qk_l2norm``;
            ``ValueError`` naming the argument. Unchecked, values outside these ranges run the
            same recurrence (with expanding transitions) and non-finite values propagate.

    Returns:
        ``(o, final_state)`` with ``o`` ``[B, T, H, V]`` in ``q``'s dtype and ``final_state`` or None.
    """
    B, T, n_h, H, K, V, N = check_inputs(q, k, v, beta, g, scale, initial_state, cu_seqlens,
                                         chunk_size, backend)
    if check_values:
        _check_values(q, k, v, beta, g, initial_state, keys_normalized=use_qk_l2norm)
    scale = float(K ** -0.5 if scale is None else scale)
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
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
