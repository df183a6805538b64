"""Locate the Triton kernels (``lrnn_scan.kernels.delta_product``; the repo's ``kernels/`` folder
when the package is used from a source checkout without installation)."""
from __future__ import annotations

from .._kernel_modules import kernel_module


def load_kernels():
    return kernel_module("delta_product")
