"""The benchmark grid: scan-level views (A) fixed number of blocks, (B) fixed hidden size, and the
layer-level view (C) parameter-matched layers — the three panels of the paper's Fig. 5.

Scan-level kinds (one "block" = the ``m`` state numbers one block/channel owns):

* ``bdlru`` — :func:`lrnn_scan.bdlru_scan` from gate logits ``(B, T, H, m, m+1)`` (fused Triton
  kernel on CUDA, normalise + :func:`lrnn_scan.scan` elsewhere). Bytes (forward) =
  ``B·T·H·m·(m+3)`` elements (logits + v read, h written); forward+backward floor =
  ``B·T·H·m·(2m+6)`` (logits, v, dh read; h, dlogits, dv written).
* ``hlru`` — :func:`lrnn_scan.hlru_scan`, logits ``(B, T, H, m+1)``, ``H`` channels of order ``m``.
  Bytes: ``B·T·H·(m+3)`` forward, ``B·T·H·(2m+6)`` forward+backward.
* ``bd_materialised`` — :func:`lrnn_scan.scan` over a materialised :class:`~lrnn_scan.BlockDiagonal`
  ``A`` (``kernels.block_diagonal`` on CUDA). Bytes: ``B·T·H·m·(m+2)``, ``B·T·H·m·(2m+4)``.

View A: ``H = blocks`` (128 on CUDA), ``N = H·m`` grows with ``m``. View B: ``N = hidden``
(768 on CUDA), ``H = N/m``. View C: stacks of ``n_layers`` pre-norm residual layers with
``d_model`` chosen per layer so the parameter count is closest to ``params`` (~33M on CUDA).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .inputs import stable_blocks

__all__ = ["Config", "ScanCase", "LayerCase", "scan_cases", "layer_cases", "make_scan_fn",
           "make_layer_fn", "ScanStack", "count_params", "match_d_model", "LAYER_BUILDERS",
           "scan_bytes"]

SCAN_KINDS = ("bdlru", "hlru", "bd_materialised")
LAYER_KINDS = ("bdlru", "hlru", "deltanet", "deltaproduct", "mamba2", "lstm")


@dataclass
class Config:
    """Sizes of one benchmark run (``Config.for_device`` gives the defaults)."""
    device: str = "cpu"
    dtype: str = "float32"
    views: tuple = ("A", "B", "C")
    modes: tuple = ("fwd", "fwdbwd")
    ms: tuple = (1, 2, 4, 8, 16, 32)
    seqlens: tuple = (256,)
    batch: int = 2
    tokens: int | None = None        # scan views: if set, B = max(1, tokens // T) (overrides batch)
    blocks: int = 16                 # view A
    hidden: int = 96                 # view B
    scan_kinds: tuple = SCAN_KINDS
    layer_kinds: tuple = LAYER_KINDS
    layer_ms: tuple = (1, 4, 16)     # block sizes / orders of the BD-LRU and H-LRU layers in view C
    params: int = 200_000            # view C target parameters
    n_layers: int = 2
    layer_seqlen: int = 128
    method: str = "auto"
    warmup: int = 1
    rep: int = 3
    peers: bool = True
    compile: bool = False
    memory: bool = True

    @classmethod
    def for_device(cls, device: str, quick: bool = False, **overrides) -> "Config":
        """Full sizes on CUDA (Fig. 5: 128 blocks, hidden 768, ~33M-parameter layers, B=8,
        T up to 16384); small CPU sizes so the whole grid runs in minutes on a laptop."""
        if torch.device(device).type == "cuda":  # NOT YET RUN ON A GPU
            # scan views: B·T = 16384 tokens (B=8 at T=2048, B=1 at T=16384): view A at m=32
            # materialises A of 8·2048·128·32²·4 B = 8.6 GB. warmup/rep are do_bench's ms.
            cfg = cls(device=device, seqlens=(2048, 16384), batch=8, tokens=16384, blocks=128,
                      hidden=768, params=33_000_000, n_layers=4, layer_seqlen=2048,
                      layer_ms=(1, 2, 4, 8, 16, 32), warmup=25, rep=100)
            if quick:
                cfg = dataclasses.replace(cfg, seqlens=(2048,), ms=(1, 4, 8, 32), layer_ms=(4,))
        else:
            cfg = cls(device=device)
            if quick:
                cfg = dataclasses.replace(cfg, seqlens=(64,), ms=(1, 4), blocks=4, hidden=16,
                                          layer_ms=(2,), params=20_000, layer_seqlen=32, rep=1,
                                          warmup=1, n_layers=1)
        return dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


# ----------------------------------------------------------------------------- scan level
@dataclass
class ScanCase:
    view: str
    kind: str
    m: int
    B: int
    T: int
    H: int                           # blocks / channels
    impl: str = "lrnn_scan"

    @property
    def N(self) -> int:              # state numbers
        return self.H * self.m


def scan_bytes(kind: str, B: int, T: int, H: int, m: int, mode: str, esize: int) -> int:
    """Bytes moved by an ideal implementation (inputs read once, outputs written once)."""
    if kind == "bdlru":
        per = H * m * ((m + 3) if mode == "fwd" else (2 * m + 6))
    elif kind == "hlru":
        per = H * ((m + 3) if mode == "fwd" else (2 * m + 6))
    elif kind in ("bd_materialised", "assoc_scan", "accelerated_scan", "fla_chunk_hgrn"):
        per = H * m * ((m + 2) if mode == "fwd" else (2 * m + 4))
    else:
        return 0
    return B * T * per * esize


def scan_cases(cfg: Config) -> list[ScanCase]:
    cases = []
    for view in cfg.views:
        if view not in ("A", "B"):
            continue
        for T in cfg.seqlens:
            for kind in cfg.scan_kinds:
                for m in cfg.ms:
                    if view == "A":
                        H = cfg.blocks
                    else:
                        if cfg.hidden % m:
                            continue
                        H = cfg.hidden // m
                    B = cfg.batch if cfg.tokens is None else max(1, cfg.tokens // T)
                    cases.append(ScanCase(view, kind, m, B, T, H))
    return cases


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def make_scan_fn(case: ScanCase, cfg: Config, mode: str, *, seed: int = 0) -> Callable[[], object]:
    """A closure running one scan (forward, or forward + backward w.r.t. all inputs)."""
    import lrnn_scan as ls
    dev, dt = torch.device(cfg.device), _dtype(cfg.dtype)
    g = torch.Generator(device=dev).manual_seed(seed)      # generate on the device itself
    B, T, H, m = case.B, case.T, case.H, case.m
    grad = mode == "fwdbwd"

    def rnd(*shape, scale=1.0):
        x = torch.randn(*shape, generator=g, device=dev) * scale
        return x.to(dt).requires_grad_(grad)

    if case.kind == "bdlru":
        z, v = rnd(B, T, H, m, m + 1), rnd(B, T, H, m)
        inputs = (z, v)
        fwd = lambda: ls.bdlru_scan(z, v, "softmax", method=cfg.method)  # noqa: E731
    elif case.kind == "hlru":
        z, v = rnd(B, T, H, m + 1), rnd(B, T, H)
        inputs = (z, v)
        fwd = lambda: ls.hlru_scan(z, v, "softmax", method=cfg.method)  # noqa: E731
    elif case.kind == "bd_materialised":
        A = stable_blocks(B, T, H, m, m, generator=g, device=dev).to(dt).requires_grad_(grad)
        b = rnd(B, T, H, m)
        inputs = (A, b)
        fwd = lambda: ls.scan(ls.BlockDiagonal(A), b, method=cfg.method)  # noqa: E731
    else:
        raise ValueError(f"unknown scan kind {case.kind!r}")
    return _with_grad(fwd, inputs, grad)


def _with_grad(fwd, inputs, grad):
    if not grad:
        def run():
            with torch.no_grad():
                return fwd()
        return run
    cot = {}

    def run():
        out = fwd()
        if "g" not in cot:
            cot["g"] = torch.randn_like(out)
        return torch.autograd.grad(out, inputs, cot["g"])
    return run


# ----------------------------------------------------------------------------- layer level
def _bdlru(d, m):
    from lrnn_scan.models import BDLRU
    return BDLRU(d, d, m=m)


def _hlru(d, m):
    from lrnn_scan.models import HLRU
    return HLRU(d, d, m=m)


def _deltanet(d, m):
    from lrnn_scan.models import DeltaNet
    return DeltaNet(d, num_heads=max(1, d // 64), head_dim=64 if d >= 64 else d)


def _deltaproduct(d, m):
    from lrnn_scan.models import DeltaProduct
    return DeltaProduct(d, num_heads=max(1, d // 64), head_dim=64 if d >= 64 else d, n_h=2)


def _mamba2(d, m):
    from lrnn_scan.models import Mamba2
    return Mamba2(d, state_size=16)


def _lstm(d, m):
    from lrnn_scan.models import LSTM
    return LSTM(d)


#: kind -> (builder(d_model, m) -> layer, d_model granularity, uses m)
LAYER_BUILDERS = {"bdlru": (_bdlru, 32, True), "hlru": (_hlru, 32, True),
                  "deltanet": (_deltanet, 64, False), "deltaproduct": (_deltaproduct, 64, False),
                  "mamba2": (_mamba2, 32, False), "lstm": (_lstm, 32, False)}


class ScanStack(nn.Module):
    """``n_layers`` pre-norm residual blocks ``x + layer(RMSNorm(x))[0]`` (no MLPs, no embedding)."""

    def __init__(self, make_layer: Callable[[], nn.Module], d_model: int, n_layers: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(n_layers))
        self.layers = nn.ModuleList(make_layer() for _ in range(n_layers))

    def forward(self, x):
        for norm, layer in zip(self.norms, self.layers):
            x = x + layer(norm(x))[0]
        return x


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def match_d_model(kind: str, m: int, target: int, n_layers: int, *, lo: int = 32,
                  hi: int = 4096) -> tuple[int, int]:
    """``(d_model, params)`` of a ``n_layers`` stack closest to ``target`` parameters (models are
    built on the meta device, so this costs no memory)."""
    build, step, _ = LAYER_BUILDERS[kind]
    best = None
    with torch.device("meta"):
        for d in range(max(lo, step), hi + 1, step):
            if kind == "bdlru" and d % m:
                continue
            p = count_params(ScanStack(lambda: build(d, m), d, n_layers))
            if best is None or abs(p - target) < abs(best[1] - target):
                best = (d, p)
            if p > target * 1.5:
                break
    return best


@dataclass
class LayerCase:
    view: str
    kind: str
    m: int | None
    d_model: int
    n_layers: int
    params: int
    B: int
    T: int
    flops_per_step: int = 0
    impl: str = "lrnn_scan"
    extra: dict = field(default_factory=dict)


def layer_cases(cfg: Config) -> list[LayerCase]:
    if "C" not in cfg.views:
        return []
    cases = []
    for kind in cfg.layer_kinds:
        build, _, uses_m = LAYER_BUILDERS[kind]
        for m in (cfg.layer_ms if uses_m else (None,)):
            d, p = match_d_model(kind, m or 1, cfg.params, cfg.n_layers)
            with torch.device("meta"):
                fl = int(build(d, m or 1).flops_per_step())
            cases.append(LayerCase("C", kind, m, d, cfg.n_layers, p, cfg.batch, cfg.layer_seqlen,
                                   flops_per_step=fl * cfg.n_layers))
    return cases


def make_layer_fn(case: LayerCase, cfg: Config, mode: str, *, seed: int = 0,
                  model: nn.Module | None = None):
    """``(closure, model)``: forward (no_grad) or forward + backward to every parameter."""
    dev, dt = torch.device(cfg.device), _dtype(cfg.dtype)
    torch.manual_seed(seed)
    if model is None:
        if case.kind in LAYER_BUILDERS:
            build = LAYER_BUILDERS[case.kind][0]
        else:                                    # a peer layer (peers.py)
            from .peers import make_peer_layer
            build = lambda d, m: make_peer_layer(case.kind, d)  # noqa: E731
        model = ScanStack(lambda: build(case.d_model, case.m or 1), case.d_model, case.n_layers)
        model = model.to(dev)
    x = torch.randn(case.B, case.T, case.d_model, device=dev)
    run_model = model
    if cfg.compile:
        from lrnn_scan.compile import enable
        enable()        # Triton kernels as custom ops (CUDA) + the Dynamo options of the torch paths
        run_model = torch.compile(model)
    params = [p for p in model.parameters() if p.requires_grad]
    autocast = (torch.autocast(dev.type, dtype=dt) if dt != torch.float32 else None)

    def fwd():
        if autocast is None:
            return run_model(x)
        with torch.autocast(dev.type, dtype=dt):
            return run_model(x)
    return _with_grad(fwd, params, mode == "fwdbwd"), model
