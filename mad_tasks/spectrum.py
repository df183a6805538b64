"""Eigenvalues of the learned per-step transitions of a trained model (paper Figs. 3 and 8).

``spectrum(checkpoint)`` rebuilds the model, feeds test sequences of its task, asks each tested
layer for ``transition_spectrum(x)`` (the interface of :mod:`lrnn_scan.models` and of the
reference layers) on the input that layer sees, and returns the eigenvalues and summary
statistics; the CLI also writes ``<out>.npz`` and, with matplotlib, ``<out>.png``.
"""
from __future__ import annotations

import numpy as np
import torch

from .train import load_checkpoint

__all__ = ["spectrum", "spectrum_stats", "plot_spectrum"]


@torch.no_grad()
def spectrum(checkpoint: str, n_seqs: int = 64, layer_index: int | None = None):
    cfg, task, model, _ = load_checkpoint(checkpoint)
    model.eval()
    X = torch.as_tensor(task.test[0][0][:n_seqs])
    out = {}
    idx = range(len(model.blocks)) if layer_index is None else [layer_index]
    for i in idx:
        layer = model.blocks[i].layer
        if not hasattr(layer, "transition_spectrum"):
            raise ValueError(f"layer {type(layer).__name__} has no transition_spectrum()")
        x = model.layer_inputs(X, i)
        ev = layer.transition_spectrum(x)
        out[i] = ev.reshape(-1).cpu().numpy().astype(np.complex128)
    return cfg, out


def spectrum_stats(ev: np.ndarray) -> dict:
    ev = np.asarray(ev)
    mag = np.abs(ev)
    return {"n": int(ev.size), "max_abs": float(mag.max()), "mean_abs": float(mag.mean()),
            "frac_negative_real": float(np.mean(ev.real < -1e-6)),
            "frac_complex": float(np.mean(np.abs(ev.imag) > 1e-6)),
            "frac_near_unit_circle": float(np.mean(mag > 0.95)),
            "min_real": float(ev.real.min())}


def plot_spectrum(evs: dict, path: str, title: str = "") -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(evs), figsize=(3.6 * len(evs), 3.6), squeeze=False)
    th = np.linspace(0, 2 * np.pi, 256)
    for ax, (i, ev) in zip(axes[0], evs.items()):
        ax.plot(np.cos(th), np.sin(th), "k-", lw=0.6)
        ax.scatter(ev.real, ev.imag, s=2, alpha=0.3)
        ax.set_xlim(-1.1, 1.1)
        ax.set_ylim(-1.1, 1.1)
        ax.set_aspect("equal")
        ax.set_xlabel("Re")
        ax.set_ylabel("Im")
        ax.set_title(f"{title} layer {i}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
