"""``lrnn-scan`` command line (also ``python -m lrnn_scan.mad_tasks``).

    lrnn-scan demo                                   # CPU-sized: BD-LRU vs diagonal LRU on S3
    lrnn-scan train --task s3 --model bdlru --block-size 3 --epochs 10
    lrnn-scan train --task parity --model bdlru -m 2 --lr 1e-3 5e-4 --seeds 0 1   # LR x seed grid
    lrnn-scan sweep --config sweep.json              # CSV + Markdown + accuracy-vs-m plot
    lrnn-scan spectrum runs/s3/checkpoint.pt         # eigenvalues of the learned transitions
    lrnn-scan launch --config jobs.json --workers 14 --deadline-s 480   # many runs on one GPU

Several processes (``train`` only; DDP, or ``--sequence-parallel`` time shards):
    torchrun --standalone --nproc-per-node 2 -m lrnn_scan.mad_tasks train --task s3 ...
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["main", "build_parser", "DEMO_DEFAULTS"]

# The README's main job: S3 word problem (k=16, 10k train), BD-LRU m=3 vs the diagonal LRU.
DEMO_DEFAULTS = dict(task="s3", task_kwargs={"n_train": 10_000, "n_test": 1_000}, d_model=32,
                     hidden_size=48, lr=2e-3, epochs=5, batch_size=128, seed=0, data_seed=0,
                     early_stop=0.999)


def _task_kwargs(a) -> dict:
    kw = json.loads(a.task_kwargs) if a.task_kwargs else {}
    for name in ("n_train", "n_test", "k", "test_k", "vocab_size", "seq_len", "n_copy",
                 "train_max_len", "test_max_len", "test_min_len", "train_min_len"):
        v = getattr(a, name, None)
        if v is not None:
            kw[name] = v
    return kw


def _add_train_args(p):
    p.add_argument("--task", default="s3", help="task name (see `lrnn-scan tasks`)")
    p.add_argument("--model", default="bdlru",
                   help="bdlru | hlru | diagonal | lstm | deltanet | deltaproduct | mamba2")
    p.add_argument("--block-size", "-m", type=int, default=None, dest="block_size",
                   help="BD-LRU block size / H-LRU order (DeltaProduct: n_h)")
    p.add_argument("--hidden-size", type=int, default=120, help="state units N")
    p.add_argument("--gate", default=None, help="gate variant (softmax default)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=1)
    p.add_argument("--mlp-ratio", type=float, default=2.0)
    p.add_argument("--layer-kwargs", default=None, help="JSON dict passed to the layer")
    p.add_argument("--layer-source", default="models", choices=["models", "reference"])
    p.add_argument("--lr", type=float, nargs="+", default=[1e-3],
                   help="one or more learning rates (several: a grid, best reported)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--min-lr", type=float, default=1e-5)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="linear LR warmup over this many steps, then the cosine")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps-per-epoch", type=int, default=None,
                   help="streaming (Chomsky) tasks: steps per epoch (100)")
    p.add_argument("--early-stop", type=float, default=0.999,
                   help="stop at this test accuracy (negative: never)")
    p.add_argument("--stop-metric", default="micro", choices=["micro", "macro"])
    p.add_argument("--grad-clip", type=float, default=None)
    p.add_argument("--data-seed", type=int, default=0)
    for name in ("n-train", "n-test", "k", "test-k", "vocab-size", "seq-len", "n-copy",
                 "train-max-len", "test-min-len", "test-max-len", "train-min-len"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--task-kwargs", default=None, help="JSON dict of task options")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--out", default=None, help="run directory (checkpoints, log.jsonl)")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--progress", default="auto", choices=["auto", "bar", "print", "none"])
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="under torchrun: every rank holds a time shard of the same batch and the "
                        "scans run across ranks (bdlru, hlru, diagonal, mamba2; decoder tasks); "
                        "default under torchrun: data parallel (DDP)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lrnn-scan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_train_args(sub.add_parser("train", help="train one model (or an LR x seed grid)"))
    p = sub.add_parser("sweep", help="run a grid from a JSON/YAML config")
    p.add_argument("--config", required=True)
    p.add_argument("--progress", default="print", choices=["auto", "bar", "print", "none"])
    p.add_argument("--threads", type=int, default=None)
    p = sub.add_parser("spectrum", help="eigenvalues of the learned transitions of a checkpoint")
    p.add_argument("checkpoint")
    p.add_argument("--out", default=None, help="output prefix (default: next to the checkpoint)")
    p.add_argument("--n-seqs", type=int, default=64)
    p = sub.add_parser("demo", help="CPU-sized demo: BD-LRU vs diagonal LRU on a state-tracking "
                                    "task (about a minute or two on 2 cores)")
    p.add_argument("--task", default=DEMO_DEFAULTS["task"])
    p.add_argument("--block-size", "-m", type=int, default=3, dest="block_size")
    p.add_argument("--epochs", type=int, default=DEMO_DEFAULTS["epochs"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--layer-source", default="models", choices=["models", "reference"])
    p.add_argument("--progress", default="print", choices=["auto", "bar", "print", "none"])
    sub.add_parser("tasks", help="list task and model names")
    from .launch import add_launch_args
    add_launch_args(sub.add_parser("launch", help="many runs at once: a process pool over a "
                                                  "job list (one GPU shared), JSONL results"))
    from lrnn_scan.bench.cli import add_subparser as add_bench   # lrnn-scan bench (issue 7)
    add_bench(sub)
    return ap


def _cmd_train(a) -> int:
    from .train import TrainConfig, run_grid, train
    cfg = TrainConfig(
        task=a.task, task_kwargs=_task_kwargs(a), data_seed=a.data_seed, model=a.model,
        block_size=a.block_size, hidden_size=a.hidden_size, gate=a.gate,
        layer_kwargs=json.loads(a.layer_kwargs) if a.layer_kwargs else {},
        layer_source=a.layer_source, d_model=a.d_model, n_layers=a.n_layers,
        mlp_ratio=a.mlp_ratio, lr=a.lr[0], min_lr=a.min_lr, weight_decay=a.weight_decay,
        warmup_steps=a.warmup_steps,
        grad_clip=a.grad_clip, batch_size=a.batch_size, epochs=a.epochs,
        steps_per_epoch=a.steps_per_epoch, seed=a.seeds[0],
        early_stop=None if a.early_stop is not None and a.early_stop < 0 else a.early_stop,
        stop_metric=a.stop_metric, device=a.device, num_threads=a.threads, out_dir=a.out,
        resume=not a.no_resume, progress=a.progress, sequence_parallel=a.sequence_parallel)
    if len(a.lr) == 1 and len(a.seeds) == 1:
        r = train(cfg)
        runs = [r]
    else:
        g = run_grid(cfg, a.lr, a.seeds, metric=a.stop_metric)
        r, runs = g["best"], g["runs"]
    from .distributed import is_main_process
    if not is_main_process():          # under torchrun only rank 0 reports
        return 0
    if len(runs) > 1:
        for x in runs:
            print(f"  lr={x['lr']:g} seed={x['seed']}: best micro {x.get('best_micro', 0):.4f} "
                  f"macro {x.get('best_macro', 0):.4f} ({x['epochs_run']} epochs)")
    line = (f"final: task={r['task']} model={r['model']}"
            + (f" m={r['block_size']}" if r['block_size'] else "")
            + f" best test accuracy micro={r.get('best_micro', float('nan')):.4f} "
              f"macro={r.get('best_macro', float('nan')):.4f}")
    if "best_scaled" in r:
        line += f" scaled={r['best_scaled']:.4f}"
    line += f" (lr={r['lr']:g}, seed={r['seed']}, epoch {r['best_epoch']}/{r['epochs_run']})"
    print(line)
    if a.json:
        print(json.dumps({k: v for k, v in r.items() if k != "history"}))
    return 0


def _cmd_sweep(a) -> int:
    from .sweep import load_config, run_sweep
    if a.threads:
        import torch
        torch.set_num_threads(a.threads)
    cfg = load_config(a.config)
    results = run_sweep(cfg, progress=a.progress)
    out = cfg.get("out_dir", "runs/sweep")
    print(f"{len(results)} runs; wrote {os.path.join(out, 'results.csv')}, "
          f"{os.path.join(out, 'results.md')}")
    with open(os.path.join(out, "results.md")) as f:
        print(f.read())
    return 0


def _cmd_spectrum(a) -> int:
    import numpy as np

    from .spectrum import plot_spectrum, spectrum, spectrum_stats
    cfg, evs = spectrum(a.checkpoint, a.n_seqs)
    prefix = a.out or os.path.join(os.path.dirname(os.path.abspath(a.checkpoint)), "spectrum")
    np.savez(prefix + ".npz", **{f"layer{i}": ev for i, ev in evs.items()})
    for i, ev in evs.items():
        s = spectrum_stats(ev)
        print(f"layer {i}: {s['n']} eigenvalues, max|λ|={s['max_abs']:.4f}, "
              f"Re<0: {s['frac_negative_real']:.3f}, complex: {s['frac_complex']:.3f}, "
              f"|λ|>0.95: {s['frac_near_unit_circle']:.3f}, min Re={s['min_real']:.4f}")
    title = f"{cfg.task} {cfg.model}" + (f" m={cfg.block_size}" if cfg.block_size else "")
    png = plot_spectrum(evs, prefix + ".png", title)
    print(f"wrote {prefix}.npz" + (f" and {png}" if png else " (no matplotlib: no plot)"))
    return 0


def _cmd_demo(a) -> int:
    from .tasks import make_task
    from .train import TrainConfig, train
    if a.threads:
        import torch
        torch.set_num_threads(a.threads)
    d = dict(DEMO_DEFAULTS, task=a.task, epochs=a.epochs, seed=a.seed)
    if a.task != DEMO_DEFAULTS["task"]:
        d["task_kwargs"] = {}
    t0 = time.time()
    task = make_task(d["task"], d["data_seed"], **d["task_kwargs"])
    rows = []
    for model, m in (("bdlru", a.block_size), ("diagonal", None)):
        cfg = TrainConfig(**d, model=model, block_size=m, layer_source=a.layer_source,
                          progress=a.progress)
        r = train(cfg, task)
        rows.append((f"{model}" + (f" m={m}" if m else ""), r))
    print(f"\n{task.name} ({task.info}), {d['epochs']} epochs max, lr {d['lr']:g}, "
          f"d_model {d['d_model']}, {d['hidden_size']} state units:")
    print("| model | test accuracy (micro) | epochs | train time |")
    print("|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['best_micro']:.4f} | {r['epochs_run']} | {r['train_time_s']:.0f}s |")
    (bd, rb), (dg, rd) = rows
    verdict = "beats" if rb["best_micro"] > rd["best_micro"] else "does NOT beat"
    print(f"\n{bd} {verdict} the diagonal LRU "
          f"({rb['best_micro']:.3f} vs {rd['best_micro']:.3f}); total {time.time() - t0:.0f}s")
    return 0


def _cmd_launch(a) -> int:
    from .launch import main_launch
    return main_launch(a)


def _cmd_tasks(_a) -> int:
    from .layers import MODEL_NAMES
    from .tasks import TASK_NAMES
    print("tasks:", ", ".join(TASK_NAMES), "(and any group such as S3xZ2, A4)")
    print("models:", ", ".join(MODEL_NAMES))
    return 0


def main(argv=None) -> int:
    from .distributed import env_world_size, teardown
    a = build_parser().parse_args(argv)
    ok = False
    try:
        if env_world_size() > 1 and a.cmd != "train":
            raise ValueError(f"only `train` runs under torchrun with several processes (WORLD_SIZE="
                             f"{env_world_size()}); run `{a.cmd}` as a single process")
        if a.cmd != "train" and getattr(a, "sequence_parallel", False):
            raise ValueError("--sequence-parallel is a `train` option")
        rc = {"train": _cmd_train, "sweep": _cmd_sweep, "spectrum": _cmd_spectrum,
              "demo": _cmd_demo, "tasks": _cmd_tasks, "launch": _cmd_launch,
              "bench": a.__dict__.get("func")}[a.cmd](a)
        ok = True
        return rc
    except (ValueError, TypeError, FileNotFoundError) as exc:
        if os.environ.get("LRNN_SCAN_DEBUG"):
            raise
        print(f"lrnn-scan {a.cmd}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        teardown(sync=ok)


if __name__ == "__main__":
    sys.exit(main())
