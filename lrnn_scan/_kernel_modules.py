"""Where the engine finds the Triton kernel packages, imported lazily on first use.

``import lrnn_scan`` must not import Triton, so the engine looks kernels up at call time. The
modules found are kept in ``_CACHE``: ``torch.compile`` (Dynamo) cannot trace
``importlib.import_module`` (a graph break, an error under ``fullgraph=True``), but it traces a
lookup in a module-level dict. ``lrnn_scan.compile.register()`` fills the cache for every kernel
package, and so does the first eager call.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

_CACHE: dict[str, ModuleType] = {}


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"lrnn_scan.kernels.{name}")
    except ModuleNotFoundError:
        # a source checkout used without installation: the repo's kernels/ folder
        root = Path(__file__).resolve().parents[1]
        if not (root / "kernels" / name.split(".")[0]).is_dir():
            raise
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return importlib.import_module(f"kernels.{name}")


def kernel_device(device) -> bool:
    """Whether the engine sends tensors on ``device`` to the Triton kernels: CUDA only. (Tests
    patch this to send CPU tensors to the Triton interpreter, e.g. to trace the kernel paths
    under ``torch.compile`` on a machine without a GPU.)"""
    return device.type == "cuda"


def kernel_module(name: str) -> ModuleType:
    """The kernel package ``lrnn_scan.kernels.<name>`` (e.g. ``"fused_gates"``), cached."""
    mod = _CACHE.get(name)
    if mod is None:
        mod = _CACHE[name] = _import(name)
    return mod
