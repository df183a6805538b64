"""Companion (H-LRU) scans: O(m) per channel-step, only the newest state component stored.

See README.md in this folder for the ring-buffer formulation and the adjoint.
"""
from .function import companion_scan, companion_scan_coeffs
from .ref import companion_scan_coeffs_ref, companion_scan_ref

__all__ = ["companion_scan", "companion_scan_coeffs", "companion_scan_ref",
           "companion_scan_coeffs_ref"]
