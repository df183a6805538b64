"""Where a trained Chomsky-task model stops extrapolating, and why: accuracy at each test length
and the spectrum of the first layer's transitions, split by input token.

    python tools/chomsky_length_diag.py CHECKPOINT [--lengths 8 40 80 160 256] [--n 512]

CHECKPOINT is a ``checkpoint.pt`` written by ``lrnn-scan train`` (or ``launch``) for a Chomsky task
(parity, cycle_navigation, ...). For a state-tracking solution to hold at length L, the transition
that the task's group element needs (parity: an eigenvalue −1 for bit 1) must keep ``|λ|`` within
about ``1/L`` of 1: the ``min Re`` and ``max |λ|`` columns show how close the model got.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch


def accuracy_by_length(model, task, lengths, n, seed=5):
    """``{L: accuracy}`` of the answer read at the query position, ``n`` fresh sequences a length."""
    rng = np.random.default_rng(seed)
    out = {}
    for L in lengths:
        x, y = task.sample(rng, n, int(L))
        with torch.no_grad():
            logits = model(torch.as_tensor(x))
        logits = logits[0] if isinstance(logits, tuple) else logits
        out[int(L)] = float((logits[:, -1].argmax(-1).numpy() == y[:, -1]).mean())
    return out


def spectrum_by_token(model, task, length=40, n=64, seed=6):
    """Per input token: statistics of the first layer's transition eigenvalues at that token."""
    rng = np.random.default_rng(seed)
    x, _ = task.sample(rng, n, length)
    layer = model.blocks[0].layer
    with torch.no_grad():
        ev = layer.transition_spectrum(model.layer_inputs(torch.as_tensor(x), 0))
    ev = ev.reshape(n, x.shape[1], -1)
    tok = torch.as_tensor(x)
    stats = {}
    for t in sorted(set(x[:, :-1].reshape(-1).tolist())):
        e = ev[:, :-1][tok[:, :-1] == t]
        stats[t] = {"max_abs": float(e.abs().max()), "min_re": float(e.real.min()),
                    "frac_abs_gt_0.99": float((e.abs() > 0.99).float().mean())}
    return stats


def main(argv=None):
    from lrnn_scan.mad_tasks.chomsky import CHOMSKY_TASKS
    from lrnn_scan.mad_tasks.train import load_checkpoint
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--lengths", type=int, nargs="+", default=[8, 20, 40, 60, 80, 120, 160, 200, 256])
    ap.add_argument("--n", type=int, default=512, help="sequences a length")
    a = ap.parse_args(argv)
    cfg, _, model, _ = load_checkpoint(a.checkpoint)
    if cfg.task not in CHOMSKY_TASKS:
        raise SystemExit(f"{a.checkpoint}: task {cfg.task!r} is not a Chomsky task ({sorted(CHOMSKY_TASKS)})")
    task = CHOMSKY_TASKS[cfg.task]
    model.eval()
    for L, acc in accuracy_by_length(model, task, a.lengths, a.n).items():
        print(f"length {L:4d}: accuracy {acc:.3f}")
    for t, s in spectrum_by_token(model, task).items():
        print(f"token {t}: max |λ| {s['max_abs']:.5f}, min Re λ {s['min_re']:.4f}, "
              f"|λ| > 0.99: {s['frac_abs_gt_0.99']:.3f}")


if __name__ == "__main__":
    main()
