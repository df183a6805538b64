"""Fused-gate block-diagonal (BD-LRU) scans: gates normalised in registers, ``A`` never in HBM.

See README.md in this folder for the derivation of the fused backward.
"""
from .function import fused_gate_scan, materialized_block_scan, unfused_faster
from .ref import block_scan_ref, fused_gate_scan_ref

__all__ = ["fused_gate_scan", "materialized_block_scan", "fused_gate_scan_ref", "block_scan_ref",
           "unfused_faster"]
