"""Grids of runs (models × block sizes × tasks × LR × seeds) -> CSV, Markdown and plots.

Config (JSON, or YAML if PyYAML is installed)::

    {
      "out_dir": "runs/sweep",              # results.csv, results.md, acc_vs_m.png, runs/...
      "tasks": ["s3", {"name": "parity", "task_kwargs": {"n_test": 1024}}],
      "models": [{"model": "bdlru", "block_size": [1, 2, 3]}, {"model": "lstm"}],
      "lrs": [1e-3, 5e-4, 1e-4],
      "seeds": [0, 1, 2, 3, 4],
      "common": {"epochs": 20, "hidden_size": 120, "d_model": 64},   # any TrainConfig field
      "metric": "micro"
    }

Every run is stored under ``out_dir/runs/<task>/<model>[-m<m>]/lr<lr>_seed<seed>`` with its own
checkpoint, so an interrupted sweep resumes where it stopped (finished runs are reloaded from
their ``result.json``).
"""
from __future__ import annotations

import csv
import json
import os

from .tasks import make_task
from .train import TrainConfig, train

__all__ = ["load_config", "run_sweep", "expand", "summarize", "write_markdown", "plot_acc_vs_m"]

CSV_FIELDS = ["task", "model", "block_size", "hidden_size", "lr", "seed", "epochs_run",
              "stopped_early", "best_epoch", "best_micro", "best_macro", "best_scaled",
              "best_seq", "final_micro", "final_macro", "n_params", "layer_source",
              "train_time_s"]


def load_config(path: str) -> dict:
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError as exc:       # pragma: no cover
            raise SystemExit("YAML configs need PyYAML (pip install pyyaml); or use JSON") from exc
        return yaml.safe_load(text)
    return json.loads(text)


def _as_list(v):
    return v if isinstance(v, (list, tuple)) else [v]


def expand(cfg: dict):
    """Yield ``(TrainConfig, run_dir)`` for every grid point."""
    out = cfg.get("out_dir", "runs/sweep")
    common = dict(cfg.get("common", {}))
    for t in cfg["tasks"]:
        t = {"name": t} if isinstance(t, str) else dict(t)
        for spec in cfg["models"]:
            spec = {"model": spec} if isinstance(spec, str) else dict(spec)
            model = spec.pop("model")
            sizes = _as_list(spec.pop("block_size", None))
            for m in sizes:
                for lr in _as_list(cfg.get("lrs", [1e-3])):
                    for seed in _as_list(cfg.get("seeds", [0])):
                        d = {**common, **{k: v for k, v in spec.items()}}
                        d.update(task=t["name"], task_kwargs={**common.get("task_kwargs", {}),
                                                              **t.get("task_kwargs", {})},
                                 model=model, block_size=m, lr=float(lr), seed=int(seed))
                        name = model + (f"-m{m}" if m is not None else "")
                        run_dir = os.path.join(out, "runs", t["name"], name,
                                               f"lr{float(lr):g}_seed{seed}")
                        d["out_dir"] = run_dir
                        yield TrainConfig.from_dict(d), run_dir


def run_sweep(cfg: dict, progress: str = "auto") -> list[dict]:
    out = cfg.get("out_dir", "runs/sweep")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sweep_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    results, tasks = [], {}
    grid = list(expand(cfg))
    for i, (tc, run_dir) in enumerate(grid):
        res_path = os.path.join(run_dir, "result.json")
        if os.path.exists(res_path):
            with open(res_path) as f:
                r = json.load(f)
        else:
            print(f"== run {i + 1}/{len(grid)}: {run_dir}", flush=True)
            tc.progress = progress
            key = (tc.task, json.dumps(tc.task_kwargs, sort_keys=True), tc.data_seed)
            if key not in tasks:
                tasks.clear()        # keep one task's data in memory at a time
                tasks[key] = make_task(tc.task, tc.data_seed, **tc.task_kwargs)
            r = train(tc, tasks[key])
            r = {k: v for k, v in r.items() if k != "history"}
            with open(res_path, "w") as f:
                json.dump(r, f, indent=2)
        results.append(r)
        _write_csv(results, os.path.join(out, "results.csv"))
    metric = cfg.get("metric", "micro")
    summary = summarize(results, metric)
    write_markdown(summary, results, os.path.join(out, "results.md"), cfg, metric)
    plot_acc_vs_m(summary, os.path.join(out, "acc_vs_m.png"), metric)
    return results


def _write_csv(results, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow({k: r.get(k, "") for k in CSV_FIELDS})


def summarize(results, metric="micro") -> dict:
    """``{(task, model, m): best run}`` — best over LR × seeds of the best-epoch metric."""
    best = {}
    for r in results:
        key = (r["task"], r["model"], r.get("block_size"))
        if key not in best or r.get(f"best_{metric}", -1) > best[key].get(f"best_{metric}", -1):
            best[key] = r
    return best


def write_markdown(summary, results, path, cfg, metric="micro"):
    tasks = sorted({k[0] for k in summary})
    models = sorted({(k[1], k[2] if k[2] is not None else 0) for k in summary})
    n_runs = {}
    for r in results:
        key = (r["task"], r["model"], r.get("block_size"))
        n_runs[key] = n_runs.get(key, 0) + 1
    lines = [f"# Sweep results ({metric} test accuracy, best over LR x seeds)", "",
             f"LRs {cfg.get('lrs')}, seeds {cfg.get('seeds')}, common "
             f"`{json.dumps(cfg.get('common', {}))}`.", "",
             "| model | " + " | ".join(tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    for model, m in models:
        mm = m if m else None
        name = model + (f" m{m}" if m else "")
        cells = []
        for t in tasks:
            r = summary.get((t, model, mm))
            cells.append("—" if r is None else f"{r.get(f'best_{metric}', float('nan')):.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Runs per cell: {sorted(set(n_runs.values()))}; CSV: results.csv."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def plot_acc_vs_m(summary, path, metric="micro"):
    """Accuracy vs block size per task (like the paper's Fig. 1D); needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tasks = sorted({k[0] for k in summary})
    fig, ax = plt.subplots(figsize=(5, 3.5))
    xs, flat = set(), []
    for model in sorted({k[1] for k in summary}):
        for t in tasks:
            acc = {k[2]: r.get(f"best_{metric}", float("nan"))
                   for k, r in summary.items() if k[0] == t and k[1] == model}
            if not acc:
                continue
            if model == "diagonal":                 # the m = 1 case of BD-LRU / H-LRU
                ax.plot([1], [acc[None]], "kx", ms=8, label=f"diagonal {t}")
                xs.add(1)
            elif None in acc:
                flat.append((acc[None], f"{model} {t}"))
            else:
                ms = sorted(acc)
                xs.update(ms)
                ax.plot(ms, [acc[m] for m in ms], "o-", label=f"{model} {t}")
    lo, hi = (min(xs), max(xs)) if xs else (1, 2)
    for y, label in flat:                        # models without a block size: flat lines
        ax.plot([lo, hi], [y, y], "--", lw=1, label=label)
    if xs:
        ax.set_xticks(sorted(xs))
    ax.set_xlabel("block size m")
    ax.set_ylabel(f"test accuracy ({metric})")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
