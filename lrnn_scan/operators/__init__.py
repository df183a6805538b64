"""Structured transition operators: see :mod:`lrnn_scan.operators.base` for the protocol."""
from .base import TransitionOperator, compose, promote_to_dense
from .block_diagonal import BlockDiagonal
from .companion import Companion
from .diagonal import Diagonal
from .householder import HouseholderProduct

__all__ = ["TransitionOperator", "compose", "promote_to_dense", "Diagonal", "BlockDiagonal",
           "Companion", "HouseholderProduct"]
