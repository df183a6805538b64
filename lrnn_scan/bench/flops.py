"""FLOPs per step of the hidden-to-hidden update (the H-LRU/BD-LRU paper's Table 5), generated from
the layers' own :meth:`flops_per_step` (projections are not counted).

=================  ==========================  ====================================================
layer              formula                     symbols
=================  ==========================  ====================================================
BD-LRU             ``2·H·m² + 2·H``            ``H = N/m`` blocks of size ``m``
H-LRU              ``2·N·m + 2·N``             ``N`` channels, order ``m``
diagonal LRU       ``4·N``                     (``m = 1`` of both)
DeltaProduct       ``n_h·H·(4·K·r + 4·K)``     ``H`` heads, key size ``K``, rank ``r = 1``
Mamba2             ``2·D·S``                   ``D`` channels, state expansion ``S``
LSTM               ``8·H² + 25·H``             hidden size ``H``
=================  ==========================  ====================================================
"""
from __future__ import annotations

import torch

__all__ = ["FORMULAS", "reference_layers", "flops_table", "flops_markdown"]

FORMULAS = {
    "bdlru": "2·H·m² + 2·H (H = N/m)",
    "hlru": "2·N·m + 2·N",
    "diagonal_lru": "4·N",
    "deltanet": "n_h·H·(4·K·r + 4·K), n_h = 1, r = 1",
    "deltaproduct": "n_h·H·(4·K·r + 4·K), r = 1",
    "mamba2": "2·D·S",
    "lstm": "8·H² + 25·H",
}


def reference_layers(hidden: int = 768, ms=(1, 2, 4, 8, 16, 32)):
    """``(name, config dict, layer)`` at a common width ``hidden`` (built on the meta device)."""
    from lrnn_scan.models import BDLRU, HLRU, LSTM, DeltaNet, DeltaProduct, DiagonalLRU, Mamba2
    out = []
    with torch.device("meta"):
        for m in ms:
            if hidden % m == 0:
                out.append(("bdlru", dict(N=hidden, m=m), BDLRU(hidden, hidden, m=m)))
        for m in ms:
            out.append(("hlru", dict(N=hidden, m=m), HLRU(hidden, hidden, m=m)))
        out.append(("diagonal_lru", dict(N=hidden), DiagonalLRU(hidden, hidden)))
        heads = max(1, hidden // 128)
        out.append(("deltanet", dict(H=heads, K=hidden // heads), DeltaNet(hidden, heads)))
        for n_h in (2, 3):
            out.append(("deltaproduct", dict(H=heads, K=hidden // heads, n_h=n_h),
                        DeltaProduct(hidden, heads, n_h=n_h)))
        out.append(("mamba2", dict(D=2 * hidden, S=16), Mamba2(hidden, state_size=16)))
        out.append(("lstm", dict(H=hidden), LSTM(hidden)))
    return out


def flops_table(hidden: int = 768, ms=(1, 2, 4, 8, 16, 32)) -> list[dict]:
    """Rows ``{layer, config, formula, flops_per_step, state_size}`` from ``flops_per_step()``."""
    rows = []
    for name, cfg, layer in reference_layers(hidden, ms):
        shapes = layer.state_shapes(1)
        state = sum(int(torch.Size(s[1:]).numel()) for k, s in shapes.items() if k != "conv")
        rows.append(dict(layer=name, config=" ".join(f"{k}={v}" for k, v in cfg.items()),
                         formula=FORMULAS[name], flops_per_step=int(layer.flops_per_step()),
                         state_size=state))
    return rows


def flops_markdown(rows: list[dict]) -> str:
    lines = ["| layer | config | FLOPs/step formula (Table 5) | FLOPs/step | state size |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['config']} | {r['formula']} | {r['flops_per_step']:,} | "
                     f"{r['state_size']:,} |")
    return "\n".join(lines)
