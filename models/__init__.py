"""Layers built on lrnn_scan, all with one interface (see :mod:`lrnn_scan.models.base`).

``layer(x, state=None, cu_seqlens=None) -> (y, state)`` with ``x``/``y`` ``[B, T, d_model]``;
``layer.step(x_t, state) -> (y_t, state)``; ``layer.init_state(batch_size)``;
``layer.flops_per_step()`` (H-LRU/BD-LRU paper, Table 5); ``layer.transition_spectrum(x)``.

=====================  ==================================================================
layer                  recurrence
=====================  ==================================================================
:class:`BDLRU`         block-diagonal, L1-normalised gates (``m x m`` blocks)
:class:`HLRU`          order-``m`` per channel (companion), L1-normalised gates
:class:`DiagonalLRU`   the ``m = 1`` case of both
:class:`DeltaProduct`  ``n_h`` Householder factors per token (:class:`DeltaNet`: ``n_h = 1``;
                       :class:`GatedDeltaProduct`, :class:`GatedDeltaNet` with a forget gate)
:class:`Mamba2`        selective diagonal SSM with state expansion (baseline)
:class:`LSTM`          ``torch.nn.LSTM`` (baseline)
=====================  ==================================================================
"""
from .base import RecurrentLayer
from .bdlru import BDLRU
from .conv import ShortConv
from .delta import DeltaNet, DeltaProduct, GatedDeltaNet, GatedDeltaProduct
from .diagonal import DiagonalLRU
from .gated_lru import GatedLRU
from .hlru import HLRU
from .lstm import LSTM
from .mamba2 import Mamba2

#: name -> class, for configuration files and task runners (``LAYERS["bdlru"](d_model, N, m=4)``).
LAYERS = {"bdlru": BDLRU, "hlru": HLRU, "diagonal_lru": DiagonalLRU, "deltanet": DeltaNet,
          "gated_deltanet": GatedDeltaNet, "deltaproduct": DeltaProduct,
          "gated_deltaproduct": GatedDeltaProduct, "mamba2": Mamba2, "lstm": LSTM}

__all__ = ["LAYERS", "RecurrentLayer", "GatedLRU", "BDLRU", "HLRU", "DiagonalLRU", "DeltaProduct", "DeltaNet",
           "GatedDeltaProduct", "GatedDeltaNet", "Mamba2", "LSTM", "ShortConv"]
