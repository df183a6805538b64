"""Triton kernels for the DeltaProduct chunkwise path (forward and native backward).

Entry point :func:`chunk_delta_product_triton`; the public, validated API is
:func:`lrnn_scan.delta.chunk_delta_product`. Derivation and layout: README.md in this folder.
"""
from .function import ChunkDeltaProductFunction, chunk_delta_product_triton

__all__ = ["ChunkDeltaProductFunction", "chunk_delta_product_triton"]
