"""Model registry: names -> sequence-mixing layers with the ``layer(x) -> (y, state)`` interface.

Layers come from :mod:`lrnn_scan.models` (issue 5) when it provides the class; otherwise a small
reference implementation in this file is used (BD-LRU, H-LRU, diagonal LRU and LSTM only), so the
harness works on its own. ``build_layer`` reports which one it used (``layer_source``).

Names: ``bdlru``, ``hlru``, ``diagonal`` (``diag``, ``lru``; the paper's ``m = 1``), ``lstm``,
``deltanet``, ``deltaproduct``, ``mamba2``. Common options: ``hidden_size`` (N state units),
``block_size`` (BD-LRU block size / H-LRU order ``m``; DeltaProduct ``n_h``, default 4), ``gate``;
any other keyword is passed to the constructor unchanged. ``deltanet``/``deltaproduct`` default to
``allow_neg_eigval=True`` (the paper's ``[-1, 1]`` variants); they and ``mamba2`` take their width
from the class defaults or ``layer_kwargs`` (``hidden_size`` is not forwarded).
"""
from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from lrnn_scan import bdlru_scan, hlru_scan
from lrnn_scan.gates import normalize_gates

__all__ = ["build_layer", "MODEL_NAMES", "canonical_model_name", "RefGatedLRU", "RefLSTM",
           "call_layer", "register_model"]

# model name -> candidate class names in lrnn_scan.models
_CLASSES = {
    "bdlru": ("BDLRU", "BlockDiagonalLRU", "BDLru"),
    "hlru": ("HLRU", "HigherOrderLRU"),
    "diagonal": ("DiagonalLRU", "DiagLRU"),
    "lstm": ("LSTM", "LSTMLayer"),
    "deltanet": ("DeltaNet",),
    "deltaproduct": ("DeltaProduct",),
    "mamba2": ("Mamba2", "Mamba2Like", "Mamba2Style", "Mamba2Layer"),
}
_ALIASES = {"bd_lru": "bdlru", "bd-lru": "bdlru", "h_lru": "hlru", "h-lru": "hlru",
            "diag": "diagonal", "lru": "diagonal", "diagonal_lru": "diagonal",
            "delta_net": "deltanet", "delta_product": "deltaproduct", "mamba": "mamba2"}
MODEL_NAMES = tuple(_CLASSES)
_DROP = object()
# per-model adjustments for lrnn_scan.models classes: the paper's DeltaNet[-1,1] and
# DeltaProduct4[-1,1] (negative eigenvalues allowed, n_h = 4); their width and Mamba2's come from
# the class defaults or layer_kwargs (``hidden_size`` is not forwarded to them).
_MODEL_DEFAULTS = {
    "deltanet": {"hidden_size": _DROP, "block_size": _DROP, "gate": _DROP,
                 "allow_neg_eigval": True},
    "deltaproduct": {"hidden_size": _DROP, "gate": _DROP, "block_size": 4,
                     "allow_neg_eigval": True},
    "mamba2": {"hidden_size": _DROP, "block_size": _DROP, "gate": _DROP},
    "lstm": {"block_size": _DROP, "gate": _DROP},
}
# constructor-argument synonyms
_SYN = {"hidden_size": ("hidden_size", "N", "n", "d_state", "state_size", "hidden"),
        "block_size": ("m", "block_size", "order", "window", "n_h", "num_householder"),
        "gate": ("gate", "gate_variant", "variant")}


_CUSTOM: dict = {}


def register_model(name: str, factory) -> None:
    """Register ``factory(d_model, hidden_size=, block_size=, gate=, **kw) -> layer`` under
    ``name`` (it takes precedence over :mod:`lrnn_scan.models` and the reference layers)."""
    _CUSTOM[name.lower()] = factory


def canonical_model_name(name: str) -> str:
    n = name.lower()
    if n in _CUSTOM:
        return n
    n = _ALIASES.get(n, n)
    if n not in _CLASSES:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES + tuple(_CUSTOM)}")
    return n


def _models_class(name: str):
    try:
        import lrnn_scan.models as M
    except Exception:       # pragma: no cover - models/ broken while it is being written
        return None
    for cls in _CLASSES[name]:
        c = getattr(M, cls, None)
        if isinstance(c, type) and issubclass(c, nn.Module):
            return c
    return None


def _map_kwargs(cls, d_model, opts: dict) -> dict:
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):   # pragma: no cover
        params = {}
    names = set(params)
    takes_var = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kw = {}
    for k, v in opts.items():
        if v is None:
            continue
        for syn in _SYN.get(k, (k,)):
            if syn in names:
                kw[syn] = v
                break
        else:
            if takes_var and k not in _SYN:
                kw[k] = v
            elif k == "gate" or (k == "block_size" and v == 1):
                continue      # the layer has no such option; skipping it changes nothing
            else:
                raise TypeError(f"{cls.__name__} takes no option {k!r} "
                                f"(constructor: {inspect.signature(cls.__init__)})")
    if "d_model" in names:
        kw["d_model"] = d_model
        return kw
    return {"__positional__": d_model, **kw}


def build_layer(model: str, d_model: int, *, hidden_size: int | None = None,
                block_size: int | None = None, gate: str | None = None,
                prefer: str = "models", **extra) -> nn.Module:
    """A layer instance for ``model``. ``prefer="models"`` (default) uses
    :mod:`lrnn_scan.models` when it has the class, ``"reference"`` forces the reference layers
    of this file. The instance gets an attribute ``layer_source`` ("models" | "reference")."""
    name = canonical_model_name(model)
    if name in _CUSTOM:
        layer = _CUSTOM[name](d_model, hidden_size=hidden_size, block_size=block_size, gate=gate,
                              **extra)
        layer.layer_source = "custom"
        return layer
    if name == "diagonal" and block_size not in (None, 1):
        raise ValueError("the diagonal LRU has block size 1")
    cls = _models_class(name) if prefer == "models" else None
    opts = dict(hidden_size=hidden_size, block_size=block_size, gate=gate, **extra)
    if cls is not None and name in _MODEL_DEFAULTS:
        for k, v in _MODEL_DEFAULTS[name].items():
            if k in ("hidden_size", "block_size", "gate"):
                if v is _DROP:
                    opts.pop(k, None)
                elif opts.get(k) is None:
                    opts[k] = v
            else:
                opts.setdefault(k, v)
    if cls is not None:
        kw = _map_kwargs(cls, d_model, opts)
        pos = kw.pop("__positional__", None)
        layer = cls(pos, **kw) if pos is not None else cls(**kw)
        layer.layer_source = "models"
        return layer
    hidden_size = hidden_size or 4 * d_model
    if name in ("bdlru", "hlru", "diagonal"):
        m = 1 if name == "diagonal" else (block_size or 1)
        layer = RefGatedLRU(d_model, hidden_size, m, gate or "softmax",
                            kind="hlru" if name == "hlru" else "bdlru", **extra)
    elif name == "lstm":
        layer = RefLSTM(d_model, hidden_size, **extra)
    else:
        raise ValueError(f"model {model!r} needs lrnn_scan.models.{_CLASSES[name][0]}, which is "
                         f"not available yet (reference layers: bdlru, hlru, diagonal, lstm)")
    layer.layer_source = "reference"
    return layer


def call_layer(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)`` -> ``y``, whether the layer returns ``(y, state)`` or ``y``."""
    out = layer(x)
    return out[0] if isinstance(out, tuple) else out


class RefGatedLRU(nn.Module):
    """Reference BD-LRU / H-LRU (``m = 1``: the diagonal LRU) on :func:`lrnn_scan.bdlru_scan`.

    ``logits = Linear(d, N·(m+1))(x)``, ``v = Linear(d, N)(x)``, L1-normalised gates per row
    (``gate``), ``y = Linear(N, d)(h)``. ``N`` must be a multiple of ``m`` for BD-LRU.
    """

    def __init__(self, d_model: int, hidden_size: int, m: int = 1, gate: str = "softmax", *,
                 kind: str = "bdlru", scan_method: str = "auto"):
        super().__init__()
        if kind == "bdlru" and hidden_size % m:
            raise ValueError(f"hidden_size={hidden_size} must be a multiple of block size m={m}")
        self.d_model, self.hidden_size, self.m, self.gate, self.kind = (
            d_model, hidden_size, m, gate, kind)
        self.scan_method = scan_method
        self.gate_proj = nn.Linear(d_model, hidden_size * (m + 1))
        self.value_proj = nn.Linear(d_model, hidden_size)
        self.out_proj = nn.Linear(hidden_size, d_model)

    def _logits(self, x):
        B, T, _ = x.shape
        z = self.gate_proj(x)
        if self.kind == "bdlru":
            return z.view(B, T, self.hidden_size // self.m, self.m, self.m + 1)
        return z.view(B, T, self.hidden_size, self.m + 1)

    def forward(self, x: Tensor, state=None, cu_seqlens=None):
        B, T, _ = x.shape
        z = self._logits(x).float()
        v = self.value_proj(x).float()
        h0 = None if state is None else state["h"]
        if self.kind == "bdlru":
            h, hT = bdlru_scan(z, v.view(B, T, -1, self.m), self.gate, initial_state=h0,
                               output_final_state=True, cu_seqlens=cu_seqlens,
                               method=self.scan_method)
            h = h.reshape(B, T, self.hidden_size)
        else:
            h, hT = hlru_scan(z, v, self.gate, initial_state=h0, output_final_state=True,
                              cu_seqlens=cu_seqlens, method=self.scan_method)
        return self.out_proj(h.to(x.dtype)), {"h": hT}

    @torch.no_grad()
    def transition_spectrum(self, x: Tensor, state=None, cu_seqlens=None) -> Tensor:
        """Eigenvalues of the per-step blocks: ``(B, T, blocks, m)`` complex (BD-LRU) or of the
        companion matrices ``(B, T, N, m)`` (H-LRU)."""
        A, _ = normalize_gates(self._logits(x).double(), self.gate)
        if self.kind == "hlru":
            m = self.m
            C = torch.zeros(*A.shape[:-1], m, m, dtype=A.dtype, device=A.device)
            C[..., 0, :] = A
            if m > 1:
                idx = torch.arange(m - 1, device=A.device)
                C[..., idx + 1, idx] = 1.0
            A = C
        return torch.linalg.eigvals(A)


class RefLSTM(nn.Module):
    """``nn.LSTM(d_model, hidden_size)`` + ``Linear(hidden_size, d_model)``. State ``{"h", "c"}``,
    each ``[B | num_seqs, hidden_size]``; ``cu_seqlens`` (``B == 1``) runs each packed sequence on
    its own, from its own row of the state (an empty sequence keeps it)."""

    def __init__(self, d_model: int, hidden_size: int):
        super().__init__()
        self.d_model, self.hidden_size = d_model, hidden_size
        self.lstm = nn.LSTM(d_model, hidden_size, batch_first=True)
        self.out_proj = nn.Linear(hidden_size, d_model)

    def forward(self, x: Tensor, state=None, cu_seqlens=None):
        if cu_seqlens is None:
            hc = None if state is None else (state["h"][None], state["c"][None])
            y, (h, c) = self.lstm(x, hc)
            return self.out_proj(y), {"h": h[0], "c": c[0]}
        if x.shape[0] != 1:
            raise ValueError(f"cu_seqlens needs batch size 1 (x.shape[0] == 1), got {x.shape[0]}")
        cu = cu_seqlens.tolist()
        n = len(cu) - 1
        zero = x.new_zeros(n, self.hidden_size)
        h0, c0 = (zero, zero) if state is None else (state["h"], state["c"])
        ys, hs, cs = [], [], []
        for i, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
            h, c = h0[i], c0[i]
            if e > s:
                y, (h, c) = self.lstm(x[:, s:e], (h[None, None], c[None, None]))
                ys.append(y)
                h, c = h[0, 0], c[0, 0]
            hs.append(h)
            cs.append(c)
        y = torch.cat(ys, 1) if ys else x.new_zeros(1, 0, self.hidden_size)
        return self.out_proj(y), {"h": torch.stack(hs), "c": torch.stack(cs)}
