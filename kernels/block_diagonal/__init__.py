"""Materialised-A block-diagonal (m = 1..32) and diagonal scans: Triton forward and backward."""
from .scan import block_diagonal_scan, diagonal_scan

__all__ = ["block_diagonal_scan", "diagonal_scan"]
