"""DeltaProduct / (gated) DeltaNet chunkwise path (issue 4).

* :func:`chunk_delta_product` — fla-compatible entry point, ``backend="torch"|"triton"|"auto"``.
* :func:`chunk_delta_product_torch` — the torch chunkwise WY/UT implementation (autograd backward).
* :func:`chunk_delta_product_triton` — Triton forward + native backward (lazy import).
* :func:`recurrent_delta_product` — token-by-token reference loop.
* :func:`l2_normalize` — row-wise L2 normalisation of q/k (fused Triton pass on CUDA).
"""
from .api import chunk_delta_product, l2_normalize
from .chunk_torch import chunk_delta_product_torch
from .reference import recurrent_delta_product


def chunk_delta_product_triton(*args, **kwargs):
    """Triton forward + native backward (see ``kernels/delta_product/README.md``)."""
    from ._kernels import load_kernels

    return load_kernels().chunk_delta_product_triton(*args, **kwargs)


__all__ = ["chunk_delta_product", "chunk_delta_product_torch", "chunk_delta_product_triton",
           "recurrent_delta_product", "l2_normalize"]
