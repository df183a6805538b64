"""lrnn-scan: linear recurrences with structured transitions, as composable operators.

    h_t = A_t h_{t-1} + b_t,   A_t ∈ {Diagonal, Companion, BlockDiagonal, HouseholderProduct, …}

Public API (shapes in each docstring):

* operators: :class:`Diagonal`, :class:`BlockDiagonal`, :class:`Companion`,
  :class:`HouseholderProduct`, the protocol :class:`TransitionOperator`, :func:`compose`,
  :func:`promote_to_dense`;
* :func:`scan` — all states (sequential reference, Blelloch, or Triton kernels on CUDA), with
  ``initial_state``, ``output_final_state``, ``reverse``, ``cu_seqlens`` and adjoint-scan gradients;
* :func:`bdlru_scan`, :func:`hlru_scan` — scans straight from gate logits (fused kernels on CUDA);
* :mod:`lrnn_scan.gates` — the L1-normalised gates; :mod:`lrnn_scan.testing` — hypothesis
  strategies and :func:`lrnn_scan.testing.check_operator_laws` for your own operators.

Importing this package imports torch only (no Triton, no kernels, no side effects).
"""
from . import gates
from ._version import __version__
from .api import SCAN_METHODS, scan
from .gated import bdlru_scan, hlru_scan
from .operators import (BlockDiagonal, Companion, Diagonal, HouseholderProduct,
                        TransitionOperator, compose, promote_to_dense)
from .scans import blelloch_scan, sequential_scan

__all__ = ["__version__", "scan", "SCAN_METHODS", "bdlru_scan", "hlru_scan", "gates",
           "TransitionOperator", "Diagonal", "BlockDiagonal", "Companion", "HouseholderProduct",
           "compose", "promote_to_dense", "sequential_scan", "blelloch_scan"]
