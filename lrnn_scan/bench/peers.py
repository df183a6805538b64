"""Peers timed in the same run when installed (``pip install 'lrnn-scan[bench]'``); each one is
optional and skipped with a message saying why.

Scan level (same inputs as our scan rows):

* ``torch_associative_scan`` — ``torch._higher_order_ops.associative_scan``: for ``m = 1`` the
  diagonal recurrence with a pointwise combine (compiled on CUDA; generic mode in eager on CPU);
  for ``m > 1`` a batched-matmul combine in generic mode (known to fail to compile on CUDA with
  torch 2.11, shared/reference/peers.md).
* ``accelerated_scan`` — ``accelerated_scan.scalar.scan`` (Triton, ``m = 1``, CUDA only).
* ``fla_chunk_hgrn`` — fla's ``chunk_hgrn`` diagonal scan (``m = 1``, CUDA only).

Layer level (view C): ``fla_gated_deltanet`` (fla.layers.GatedDeltaNet, CUDA only) at the
parameter count of the other layers; the cuDNN LSTM is our :class:`lrnn_scan.models.LSTM`
(``torch.nn.LSTM``; cuDNN on CUDA, ATen's CPU LSTM on CPU).

None of the CUDA-only peers has been run by this package's authors yet (no GPU time when this
was written); they are wired as documented by each project.
"""
from __future__ import annotations

import importlib

import torch

from .inputs import stable_blocks
from .suite import Config, LayerCase, ScanCase, _dtype, _with_grad

__all__ = ["scan_peer_fns", "layer_peer_cases", "make_peer_layer", "fla_gated_deltanet_class",
           "fla_disable_hopper_guard"]


def _diag_inputs(case: ScanCase, cfg: Config, grad: bool, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, T, N = case.B, case.T, case.H * case.m
    dev, dt = torch.device(cfg.device), _dtype(cfg.dtype)
    a = (torch.rand(B, T, N, generator=g) * 0.99).to(dev, dt).requires_grad_(grad)
    b = torch.randn(B, T, N, generator=g).to(dev, dt).requires_grad_(grad)
    return a, b


def _assoc_scan(case, cfg, mode):
    try:
        from torch._higher_order_ops.associative_scan import associative_scan
    except ImportError as exc:
        return None, f"torch associative_scan not importable ({exc})"
    grad = mode == "fwdbwd"
    dev = torch.device(cfg.device)
    if case.m == 1:
        a, b = _diag_inputs(case, cfg, grad)

        def comb(x, y):
            return (x[0] * y[0], y[0] * x[1] + y[1])
        if dev.type == "cuda":  # NOT YET RUN ON A GPU
            f = torch.compile(lambda a, b: associative_scan(comb, (a, b), dim=1,
                                                            combine_mode="pointwise")[1])
        else:
            f = lambda a, b: associative_scan(comb, (a, b), dim=1, combine_mode="generic")[1]  # noqa: E731
        return _with_grad(lambda: f(a, b), (a, b), grad), ""
    if dev.type == "cuda":
        return None, ("generic (matrix) associative_scan skipped on CUDA for m > 1: log T passes "
                      "of m x m products over HBM (shared/reference/peers.md: fails to compile)")
    g = torch.Generator(device="cpu").manual_seed(0)
    B, T, H, m = case.B, case.T, case.H, case.m
    A = stable_blocks(B, T, H, m, m, generator=g).to(dev, _dtype(cfg.dtype)).requires_grad_(grad)
    b = torch.randn(B, T, H, m, 1, generator=g).to(dev, _dtype(cfg.dtype)).requires_grad_(grad)

    def combm(x, y):  # x earlier, y later: (A_y A_x, A_y b_x + b_y)
        return (y[0] @ x[0], y[0] @ x[1] + y[1])
    return _with_grad(lambda: associative_scan(combm, (A, b), dim=1, combine_mode="generic")[1],
                      (A, b), grad), ""


def _accelerated_scan(case, cfg, mode):
    if case.m != 1:
        return None, "accelerated-scan is diagonal only (m = 1)"
    if torch.device(cfg.device).type != "cuda":
        return None, "accelerated-scan needs CUDA"
    try:  # NOT YET RUN ON A GPU
        from accelerated_scan.scalar import scan as as_scan
    except Exception as exc:  # noqa: BLE001
        return None, f"accelerated-scan not installed ({type(exc).__name__}: {exc})"
    grad = mode == "fwdbwd"
    a, b = _diag_inputs(case, cfg, False)
    at = a.transpose(1, 2).contiguous().requires_grad_(grad)       # (B, C, T) layout
    bt = b.transpose(1, 2).contiguous().requires_grad_(grad)
    return _with_grad(lambda: as_scan(at, bt), (at, bt), grad), ""


def _fla_chunk_hgrn(case, cfg, mode):
    if case.m != 1:
        return None, "fla chunk_hgrn is diagonal only (m = 1)"
    if torch.device(cfg.device).type != "cuda":
        return None, "fla needs CUDA"
    try:  # NOT YET RUN ON A GPU
        from fla.ops.hgrn import chunk_hgrn
    except Exception as exc:  # noqa: BLE001
        return None, f"fla not installed ({type(exc).__name__}: {exc})"
    grad = mode == "fwdbwd"
    a, b = _diag_inputs(case, cfg, False)
    g = a.clamp_min(1e-6).log().requires_grad_(grad)      # chunk_hgrn takes the log-decay
    x = b.detach().requires_grad_(grad)
    return _with_grad(lambda: chunk_hgrn(x, g)[0], (x, g), grad), ""


SCAN_PEERS = {"torch_associative_scan": _assoc_scan, "accelerated_scan": _accelerated_scan,
              "fla_chunk_hgrn": _fla_chunk_hgrn}


def scan_peer_fns(case: ScanCase, cfg: Config, mode: str):
    """``[(peer name, closure or None, reason)]`` for a ``bd_materialised`` case (peers get the
    same recurrence with a materialised transition)."""
    out = []
    for name, make in SCAN_PEERS.items():
        try:
            fn, why = make(case, cfg, mode)
        except Exception as exc:  # noqa: BLE001 - a broken optional peer must not stop the run
            fn, why = None, f"{type(exc).__name__}: {exc}"
        out.append((name, fn, why))
    return out


# ----------------------------------------------------------------------------- layer peers
def fla_disable_hopper_guard() -> None:
    """Let fla 0.6 run its gated ``chunk_bwd_dqkwg`` on Hopper with Triton 3.4-3.7.0, which it refuses
    (its #640: wrong results there), so that benchmarks can take its *time*; they must label such rows
    and compare fla's gradients with ours. The guard reads this module global at call time."""
    import fla.ops.common.chunk_o as fla_chunk_o  # type: ignore
    fla_chunk_o.TRITON_ABOVE_3_7_1 = True


def fla_gated_deltanet_class():
    """``fla.layers.GatedDeltaNet`` (flash-linear-attention 0.6).

    ``fla/layers/__init__`` imports every fla layer, and some of them import ``transformers``;
    GatedDeltaNet itself needs it only for type checking. When ``transformers`` is missing, the
    module ``fla.layers.gated_deltanet`` is loaded on its own under a bare ``fla.layers`` package
    (no other fla layer is imported). Raises ImportError when fla is not installed.
    """
    try:
        return importlib.import_module("fla.layers").GatedDeltaNet
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("transformers"):
            raise
    import sys
    import types
    from pathlib import Path

    import fla
    pkg = types.ModuleType("fla.layers")
    pkg.__path__ = [str(Path(p) / "layers") for p in fla.__path__]
    sys.modules["fla.layers"] = pkg
    return importlib.import_module("fla.layers.gated_deltanet").GatedDeltaNet


def _fla_gdn_available(cfg: Config) -> str:
    if torch.device(cfg.device).type != "cuda":
        return "fla GatedDeltaNet needs CUDA"
    try:
        fla_gated_deltanet_class()
    except Exception as exc:  # noqa: BLE001
        return f"fla not installed ({type(exc).__name__}: {exc})"
    return ""


def make_peer_layer(kind: str, d_model: int):
    """fla's GatedDeltaNet layer wrapped to return ``(y, None)`` like our layers."""
    GatedDeltaNet = fla_gated_deltanet_class()

    class _FlaGDN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = GatedDeltaNet(hidden_size=d_model, head_dim=64,
                                       num_heads=max(1, d_model // 64), mode="chunk")

        def forward(self, x):
            return self.inner(x)[0], None
    return _FlaGDN()


def layer_peer_cases(cfg: Config, params: int) -> tuple[list[LayerCase], list[str]]:
    """fla GatedDeltaNet at ``params`` parameters, or ``([], [reason])``."""
    why = _fla_gdn_available(cfg)
    if why:
        return [], [f"fla_gated_deltanet: skipped ({why})"]
    from .suite import ScanStack, count_params  # NOT YET RUN ON A GPU
    best = None
    with torch.device("meta"):
        for d in range(64, 4097, 64):
            p = count_params(ScanStack(lambda: make_peer_layer("fla", d), d, cfg.n_layers))
            if best is None or abs(p - params) < abs(best[1] - params):
                best = (d, p)
            if p > 1.5 * params:
                break
    return [LayerCase("C", "fla_gated_deltanet", None, best[0], cfg.n_layers, best[1], cfg.batch,
                      cfg.layer_seqlen, impl="fla")], []
