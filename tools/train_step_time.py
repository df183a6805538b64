"""Training-step time of the synthetic-task harness with P processes sharing one GPU.

`lrnn-scan launch` runs many small trainings at once; how many processes fill the GPU, and what a
step costs, decide how many steps a wall-time budget buys (mad_tasks/RESULTS.md: S5 is short of
steps). For each P this starts P spawned processes at once, each training the same config for
``--epochs`` epochs (epoch 1 includes Triton compilation and is not timed), and reports the
per-process step time of the last epoch (its wall time, evaluation included, / its steps) and
the aggregate steps/s.

    python tools/train_step_time.py --procs 1 4 9 14 [--task s5_100k --model bdlru --m 5]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def _one(cfg: dict, q):
    import torch
    from lrnn_scan.mad_tasks import TrainConfig, train
    torch.set_num_threads(1)
    r = train(TrainConfig(**cfg))
    h = r["history"][-1]
    steps = r["history"][-1]["step"] - (r["history"][-2]["step"] if len(r["history"]) > 1 else 0)
    q.put(dict(step_ms=1e3 * h["epoch_time"] / max(steps, 1), steps=steps,
               epoch_s=h["epoch_time"], micro=h["test_micro"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 4, 9, 14])
    ap.add_argument("--task", default="s5_100k")
    ap.add_argument("--model", default="bdlru")
    ap.add_argument("--m", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=960)
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    a = ap.parse_args()
    cfg = dict(task=a.task, model=a.model, block_size=a.m, epochs=a.epochs, d_model=128,
               hidden_size=a.hidden, batch_size=128, num_threads=1, progress="none", early_stop=None,
               lr=1e-3)
    ctx = mp.get_context("spawn")
    rows = []
    for P in a.procs:
        q = ctx.Queue()
        t0 = time.time()
        ps = [ctx.Process(target=_one, args=(cfg, q)) for _ in range(P)]
        for p in ps:
            p.start()
        res = [q.get() for _ in ps]
        for p in ps:
            p.join()
        ms = sorted(r["step_ms"] for r in res)
        row = dict(procs=P, step_ms_median=round(ms[len(ms) // 2], 3), step_ms_max=round(ms[-1], 3),
                   agg_steps_per_s=round(sum(1e3 / r["step_ms"] for r in res), 1),
                   wall_s=round(time.time() - t0, 1), **{k: v for k, v in cfg.items()
                                                         if k in ("task", "model", "block_size")})
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
