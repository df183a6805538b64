"""Model wrappers around a tested layer (``shared/reference/tasks.md`` §1, "Wrappers").

* :class:`DecoderLM` — ``Embedding(V, d)`` → ``n_layers`` × [``x + layer(norm(x))``, then, if
  ``mlp_ratio > 0``, ``x + MLP(norm(x))``] → ``norm`` → ``Linear(d, n_out)``.
* :class:`AutoEncoder` (compression) — encoder: embedding + the same blocks, the last position
  pooled, an encoder MLP; decoder: that vector broadcast over the ``L`` positions plus a
  sinusoidal position embedding, a decoder MLP, ``Linear(d, n_out)``.

Embedding, MLP and head weights are initialised N(0, 0.02) with zero biases; the tested layer
keeps its own initialisation.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .layers import call_layer

__all__ = ["DecoderLM", "AutoEncoder", "Block", "MLP", "sinusoidal_positions", "build_model",
           "set_sequence_parallel"]


def _init(module: nn.Module):
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int, d_out: int | None = None):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d_out or d)
        _init(self)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, layer: nn.Module, mlp_ratio: float = 2.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.layer = layer
        self.mlp = None
        if mlp_ratio and mlp_ratio > 0:
            self.norm2 = nn.LayerNorm(d_model)
            self.mlp = MLP(d_model, max(1, int(round(mlp_ratio * d_model))))

    def forward(self, x: Tensor) -> Tensor:
        x = x + call_layer(self.layer, self.norm1(x))
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x


class DecoderLM(nn.Module):
    def __init__(self, vocab_size: int, n_out: int, d_model: int, layers: list[nn.Module],
                 mlp_ratio: float = 2.0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        _init(self.embed)
        self.blocks = nn.ModuleList(Block(d_model, lay, mlp_ratio) for lay in layers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_out)
        _init(self.head)

    def layer_inputs(self, tokens: Tensor, index: int = 0) -> Tensor:
        """The (normed) input the ``index``-th tested layer sees, for spectra."""
        x = self.embed(tokens)
        for blk in self.blocks[:index]:
            x = blk(x)
        return self.blocks[index].norm1(x)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def sinusoidal_positions(length: int, d: int, device=None) -> Tensor:
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    i = torch.arange(0, d, 2, device=device, dtype=torch.float32)
    freq = torch.exp(-math.log(10000.0) * i / d)
    pe = torch.zeros(length, d, device=device)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return pe


class AutoEncoder(nn.Module):
    def __init__(self, vocab_size: int, n_out: int, d_model: int, layers: list[nn.Module],
                 mlp_ratio: float = 2.0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        _init(self.embed)
        self.blocks = nn.ModuleList(Block(d_model, lay, mlp_ratio) for lay in layers)
        self.norm = nn.LayerNorm(d_model)
        hid = max(1, int(round(max(mlp_ratio, 1.0) * d_model)))
        self.encoder_mlp = MLP(d_model, hid)
        self.decoder_mlp = MLP(d_model, hid)
        self.dec_norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_out)
        _init(self.head)

    def layer_inputs(self, tokens: Tensor, index: int = 0) -> Tensor:
        x = self.embed(tokens)
        for blk in self.blocks[:index]:
            x = blk(x)
        return self.blocks[index].norm1(x)

    def forward(self, tokens: Tensor) -> Tensor:
        B, L = tokens.shape
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        z = self.encoder_mlp(self.norm(x[:, -1]))                    # (B, d)
        pe = sinusoidal_positions(L, z.shape[-1], z.device).to(z.dtype)
        y = z[:, None, :] + pe[None]
        y = self.decoder_mlp(self.dec_norm(y))
        return self.head(y)


def build_model(arch: str, vocab_size: int, n_out: int, d_model: int, layers, mlp_ratio=2.0):
    cls = {"decoder": DecoderLM, "autoencoder": AutoEncoder}[arch]
    return cls(vocab_size, n_out, d_model, list(layers), mlp_ratio)


def set_sequence_parallel(model: nn.Module, group) -> None:
    """Switch ``model``'s recurrent layers to sequence-parallel mode over ``group`` (a
    ``torch.distributed`` process group; ``None`` switches back): each rank then runs the model on
    its contiguous time shard of the same batch, and the layers' scans (and short convolutions)
    run across the group (:mod:`lrnn_scan.distributed`). Only the decoder LM qualifies (every
    other part of it is per token), with layers that declare ``supports_sequence_parallel``
    (:class:`lrnn_scan.models.BDLRU`, ``HLRU``, ``DiagonalLRU``, ``Mamba2``); anything else raises
    a ``ValueError`` naming it."""
    if not isinstance(model, DecoderLM):
        raise ValueError(f"sequence-parallel mode needs the decoder LM (per-token); "
                         f"{type(model).__name__} is not supported (the compression autoencoder "
                         "pools the last position)")
    bad = sorted({f"{type(b.layer).__name__} (layer source "
                  f"{getattr(b.layer, 'layer_source', '?')})" for b in model.blocks
                  if not getattr(b.layer, "supports_sequence_parallel", False)})
    if bad:
        raise ValueError(f"sequence-parallel mode is not supported by {', '.join(bad)}; "
                         "supported: lrnn_scan.models BDLRU, HLRU, DiagonalLRU, Mamba2 "
                         "(models bdlru, hlru, diagonal, mamba2 with --layer-source models)")
    for b in model.blocks:
        b.layer.sequence_parallel_group = group
