"""Locate the Triton kernels (``lrnn_scan.kernels.delta_product``; the repo's ``kernels/`` folder
when the package is used from a source checkout without installation)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path


def load_kernels():
    try:
        return importlib.import_module("lrnn_scan.kernels.delta_product")
    except ModuleNotFoundError:
        root = str(Path(__file__).resolve().parents[2])
        if (Path(root) / "kernels" / "delta_product").is_dir() and root not in sys.path:
            sys.path.insert(0, root)
        return importlib.import_module("kernels.delta_product")
