"""Many small trainings at once on one machine (one GPU shared by a process pool).

The models of the synthetic tasks are tiny, so one GPU is best used by many training processes
at once. :func:`run_jobs` runs a job list through a pool of ``workers`` processes (``spawn``; each
``torch.set_num_threads(threads)``, 1 by default), in the list's order, and appends one JSON line
per finished run to ``out_dir/results.jsonl`` as it finishes, so a batch that is cut off keeps
what it did. A wall-clock deadline ``stop_at`` (unix time) bounds the whole batch: a job that
would start with less than ``min_start_s`` left is recorded as ``skipped``; a running job gets
``TrainConfig.stop_at = stop_at - eval_margin_s`` (it stops after the current step and is
evaluated) and its ``time_budget_s`` is cut to the time left, so its cosine schedule is fitted
to the epochs that still fit (see ``TrainConfig.time_budget_s``).

Config (JSON): sweep-style groups, run in order (``priority`` first, then file order)::

    {
      "out_dir": "runs/gpu_tables",
      "workers": 14, "threads": 1,
      "groups": [
        {"name": "table4_s3", "priority": 1,
         "tasks": ["s3_10k"], "models": [{"model": "bdlru", "block_size": [1, 2, 3]}],
         "lrs": [1e-3], "seeds": [0],
         "common": {"epochs": 200, "time_budget_s": 110, "d_model": 128, "hidden_size": 960}}
      ]
    }

With ``"pause": true`` (and ``"checkpoints": true``) the deadline pauses each run at an epoch
boundary instead of shortening its schedule; launching the same config again (the same
``out_dir``, e.g. carried to the next machine) resumes every run where it stopped, so schedules
longer than one machine session are trained in pieces (a run that finished returns at once).

``lrnn-scan launch --config cfg.json [--workers N] [--deadline-s S | --stop-at T]`` runs it and
writes ``results.jsonl`` and ``summary.md`` (best over LR x seeds per group/task/model, beside the
paper's number; :func:`summary_markdown`). ``lrnn-scan launch --summarize results.jsonl``
rebuilds the summary from JSONL files (``--merge-groups``: best per task x model over all of them).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

from .paper import TABLE_OF_TASK, paper_value
from .sweep import expand

__all__ = ["expand_jobs", "run_jobs", "summary_markdown", "load_records", "best_records"]

_TASK_CACHE: dict = {}


def expand_jobs(cfg: dict) -> list[dict]:
    """Job dicts ``{"id", "group", "priority", "config"}`` (config: a ``TrainConfig`` dict) in
    run order: by group ``priority`` (default 100), then file order."""
    groups = sorted(enumerate(cfg["groups"]), key=lambda g: (g[1].get("priority", 100), g[0]))
    jobs = []
    for gi, g in groups:
        name = g.get("name", f"group{gi}")
        sub = {k: v for k, v in g.items() if k not in ("name", "priority")}
        sub["out_dir"] = os.path.join(cfg.get("out_dir", "runs/launch"), name)
        for tc, run_dir in expand(sub):
            d = tc.to_dict()
            d["out_dir"] = run_dir if cfg.get("checkpoints", False) else None
            d["progress"] = "none"
            jobs.append({"id": len(jobs), "group": name, "priority": g.get("priority", 100),
                         "config": d})
    return jobs


def _init_worker(threads: int):
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch
    torch.set_num_threads(threads)


def _get_task(cfg):
    from .tasks import make_task
    key = (cfg.task, json.dumps(cfg.task_kwargs, sort_keys=True), cfg.data_seed)
    if key not in _TASK_CACHE:
        if len(_TASK_CACHE) >= 2:
            _TASK_CACHE.pop(next(iter(_TASK_CACHE)))
        _TASK_CACHE[key] = make_task(cfg.task, cfg.data_seed, **cfg.task_kwargs)
    return _TASK_CACHE[key]


def _run_one(job: dict, stop_at: float | None, min_start_s: float, eval_margin_s: float,
             retry_without_amp: bool = False, pause: bool = False) -> dict:
    """Worker: train one job; never raises (errors come back as records). With
    ``retry_without_amp`` a run that raised under bf16 autocast is run once more in float32
    (``amp="off"``; the record says so under ``amp_error``). ``pause``: the deadline pauses the
    run at an epoch boundary (``TrainConfig.pause_at``; status ``paused``, the schedule unchanged)
    instead of fitting its schedule to the time left; the next launch of the same config resumes
    it from its checkpoint."""
    from .train import TrainConfig, train
    t_start = time.time()
    rec = {"id": job["id"], "group": job["group"], "pid": os.getpid(), "t_start": t_start}
    cfg = TrainConfig.from_dict(job["config"])
    rec.update(task=cfg.task, model=cfg.model, block_size=cfg.block_size, lr=cfg.lr,
               seed=cfg.seed, config=job["config"])
    if stop_at is not None:
        left = stop_at - t_start
        if left < min_start_s:
            rec.update(status="skipped", reason=f"{left:.0f}s left at start (< {min_start_s}s)")
            return rec
        if pause:
            cfg.pause_at = stop_at - eval_margin_s
        else:
            cfg.stop_at = stop_at - eval_margin_s
            budget = left - eval_margin_s
            if cfg.time_budget_s is None or budget < cfg.time_budget_s:
                rec["budget_cut_by_deadline"] = True
                cfg.time_budget_s = budget
    rec["time_budget_s"] = cfg.time_budget_s
    try:
        task = _get_task(cfg)
        try:
            r = train(cfg, task)
        except Exception as exc:        # noqa: BLE001
            if not retry_without_amp or cfg.amp == "off":
                raise
            rec["amp_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            cfg.amp = "off"
            r = train(cfg, task)
        hist = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in h.items()}
                for h in r.pop("history")]
        rec.update(status="paused" if r.get("paused") else "ok", **r, history=hist)
        if rec["status"] == "paused":
            rec["reason"] = (f"after epoch {r['epochs_run']} of {r['epochs_planned']} (best micro "
                             f"{r.get('best_micro', float('nan')):.4f} so far); launch the same "
                             "config again to continue")
    except Exception as exc:          # noqa: BLE001 - report, keep the pool alive
        rec.update(status="error", error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc()[-4000:])
    rec["t_end"] = time.time()
    return rec


def _line(rec: dict) -> str:
    name = f"{rec['group']}/{rec['task']}/{rec['model']}" + (
        f"-m{rec['block_size']}" if rec.get("block_size") else "") + \
        f" lr={rec['lr']:g} s={rec['seed']}"
    if rec.get("amp_error"):
        name += " [fp32 retry]"
    if rec["status"] != "ok":
        return f"{name}: {rec['status'].upper()} {rec.get('reason') or rec.get('error', '')}"
    extra = f" scaled {rec['best_scaled']:.4f}" if "best_scaled" in rec else ""
    stop = ("early stop" if rec.get("stopped_early") else
            "time limit" if rec.get("time_limited") else "schedule end")
    return (f"{name}: best micro {rec.get('best_micro', float('nan')):.4f} macro "
            f"{rec.get('best_macro', float('nan')):.4f}{extra} (epoch {rec.get('best_epoch')}/"
            f"{rec.get('epochs_run')} of {rec.get('epochs_planned')} planned, {stop}, "
            f"{rec.get('steps')} steps, {rec['t_end'] - rec['t_start']:.0f}s)")


def run_jobs(jobs: list[dict], out_dir: str, *, workers: int = 4, threads: int = 1,
             stop_at: float | None = None, min_start_s: float = 20.0,
             eval_margin_s: float = 10.0, max_tasks_per_child: int | None = None,
             retry_without_amp: bool = False, pause: bool = False, log=print) -> list[dict]:
    """Run ``jobs`` (from :func:`expand_jobs`) through a spawn process pool; append every
    record to ``out_dir/results.jsonl`` as it comes; write ``out_dir/summary.md`` at the end.
    ``workers <= 1`` runs them in this process (no pool). ``pause``: see :func:`_run_one` (the
    jobs need checkpoint directories: the config's ``"checkpoints": true``)."""
    if pause and any(not j["config"].get("out_dir") for j in jobs):
        raise ValueError('pause needs checkpoint directories: set "checkpoints": true in the config')
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.jsonl")
    t0 = time.time()
    records = []

    def done(rec):
        records.append(rec)
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        log(f"[launch {time.time() - t0:6.0f}s] {len(records)}/{len(jobs)} {_line(rec)}")

    log(f"[launch] {len(jobs)} jobs, {workers} workers x {threads} threads"
        + (f", {stop_at - t0:.0f}s to the deadline" if stop_at else ""))
    if workers <= 1:
        _init_worker(threads)
        for job in jobs:
            done(_run_one(job, stop_at, min_start_s, eval_margin_s, retry_without_amp, pause))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        kw = {}
        if max_tasks_per_child and sys.version_info >= (3, 11):
            kw["max_tasks_per_child"] = max_tasks_per_child
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                 initializer=_init_worker, initargs=(threads,), **kw) as ex:
            futs = {ex.submit(_run_one, j, stop_at, min_start_s, eval_margin_s,
                              retry_without_amp, pause): j for j in jobs}
            for fut in as_completed(futs):
                try:
                    rec = fut.result()
                except Exception as exc:          # noqa: BLE001 - a worker died
                    j = futs[fut]
                    c = j["config"]
                    rec = {"id": j["id"], "group": j["group"], "task": c["task"],
                           "model": c["model"], "block_size": c.get("block_size"),
                           "lr": c["lr"], "seed": c["seed"], "status": "error",
                           "error": f"worker: {type(exc).__name__}: {exc}", "config": c}
                done(rec)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(records))
    log(f"[launch] done in {time.time() - t0:.0f}s: "
        + ", ".join(f"{s} {sum(r['status'] == s for r in records)}"
                    for s in ("ok", "paused", "skipped", "error")))
    return records


# ----------------------------------------------------------------------------- summaries
def load_records(path: str) -> list[dict]:
    """The records of one ``results.jsonl``, the last one per run: a paused run that a later
    launch of the same config continued, or finished, is appended to the file again (same group,
    task, model, block size, LR and seed); only its latest state counts."""
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    latest = {(r.get("group"), r.get("task"), r.get("model"), r.get("block_size"), r.get("lr"),
               r.get("seed")): r for r in records}
    return list(latest.values())


def best_records(records: list[dict], metric: str = "micro", merge_groups: bool = False) -> dict:
    """``{(group, task, model, block_size): (best record, [all ok records])}``; best = highest
    best-epoch ``metric`` over LR x seeds. ``merge_groups``: one entry per (task, model,
    block_size) over every group (and every results file passed in), group ``"all"``: the
    paper's "best over the LR grid x seeds" when the runs came from several launches."""
    out: dict = {}
    for r in records:
        if r.get("status") != "ok":
            continue
        key = ("all" if merge_groups else r["group"], r["task"], r["model"], r.get("block_size"))
        best, allr = out.get(key, (None, []))
        allr.append(r)
        if best is None or r.get(f"best_{metric}", -1) > best.get(f"best_{metric}", -1):
            best = r
        out[key] = (best, allr)
    return out


def _model_name(model, m):
    if model == "deltaproduct":
        return f"DeltaProduct{m or 4}[-1,1]"
    return {"bdlru": f"BD-LRU m{m}", "hlru": f"H-LRU m{m}", "diagonal": "diagonal LRU",
            "deltanet": "DeltaNet[-1,1]", "lstm": "LSTM", "mamba2": "Mamba2"}.get(model, model)


def _run_label(r: dict, metric: str) -> str:
    """``lr:seed=accuracy`` of one run, with its hidden size and weight decay where they are not
    the protocol's 960 and 0 (``5e-4:0 h1920=0.665``): a merged row may mix them."""
    cfg = r.get("config") or {}
    extra = ""
    if r.get("hidden_size", cfg.get("hidden_size", 960)) not in (None, 960):
        extra += f" h{r.get('hidden_size', cfg.get('hidden_size'))}"
    if cfg.get("weight_decay") not in (None, 0, 0.0):
        extra += f" wd{cfg['weight_decay']:g}"
    return f"{r['lr']:g}:{r['seed']}{extra}={r.get(f'best_{metric}', float('nan')):.3f}"


def summary_markdown(records: list[dict], metric: str = "micro", merge_groups: bool = False) -> str:
    """One row per (group, task, model): ours (best over the runs) beside the paper's number
    (``merge_groups``: one row per (task, model) over all groups, see :func:`best_records`)."""
    lines = ["| group | task | model | runs (lr:seed, hidden / weight decay if not 960 / 0) | "
             "ours: best micro | macro | scaled | "
             "best epoch / run / planned | stop | steps | wall s | paper | diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = best_records(records, metric, merge_groups).items()
    if merge_groups:            # the paper's table order: task, then model, then block size
        rows = sorted(rows, key=lambda kv: (kv[0][1], kv[0][2], kv[0][3] or 0))
    for (group, task, model, m), (r, allr) in rows:
        paper = paper_value(task, model, m)
        runs = ", ".join(_run_label(x, metric) for x in allr)
        stop = ("early" if r.get("stopped_early") else "time" if r.get("time_limited")
                else "end")
        ours = r.get(f"best_{metric}", float("nan"))
        lines.append(
            f"| {group} | {task} | {_model_name(model, m)} | {runs} | {ours:.3f} | "
            f"{r.get('best_macro', float('nan')):.3f} | "
            + (f"{r['best_scaled']:.3f}" if "best_scaled" in r else "—")
            + f" | {r.get('best_epoch')} / {r.get('epochs_run')} / {r.get('epochs_planned')} | "
            f"{stop} | {r.get('steps')} | {r.get('wall_time_s', float('nan')):.0f} | "
            + (f"{paper:.3f} ({TABLE_OF_TASK.get(task, '')})" if paper is not None else "—")
            + " | " + (f"{ours - paper:+.3f}" if paper is not None else "—") + " |")
    bad = [r for r in records if r.get("status") != "ok"]
    if bad:
        lines += ["", "Not finished:", ""]
        lines += [f"* {r['group']}/{r['task']}/{_model_name(r['model'], r.get('block_size'))} "
                  f"lr {r['lr']:g} seed {r['seed']}: {r['status']} "
                  f"{r.get('reason') or r.get('error', '')}" for r in bad]
    return "\n".join(lines) + "\n"


def main_launch(a) -> int:
    """``lrnn-scan launch`` (see :mod:`.cli`)."""
    if a.summarize:
        records = [r for path in a.summarize for r in load_records(path)]
        print(summary_markdown(records, merge_groups=a.merge_groups), end="")
        return 0
    if not a.config:
        raise ValueError("launch needs --config (or --summarize results.jsonl)")
    from .sweep import load_config
    cfg = load_config(a.config)
    jobs = expand_jobs(cfg)
    if a.only:
        jobs = [j for j in jobs if j["group"] in a.only]
    if a.limit:
        jobs = jobs[:a.limit]
    for key, val in (a.override or []):
        for j in jobs:
            j["config"][key] = json.loads(val)
    out = a.out or cfg.get("out_dir", "runs/launch")
    stop_at = a.stop_at if a.stop_at else (time.time() + a.deadline_s if a.deadline_s else None)
    if a.dry_run:
        for j in jobs:
            c = j["config"]
            print(f"{j['id']:3d} {j['group']} {c['task']} {c['model']} m={c['block_size']} "
                  f"lr={c['lr']:g} seed={c['seed']} epochs={c['epochs']} "
                  f"budget={c.get('time_budget_s')}")
        return 0
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "launch_config.json"), "w") as f:
        json.dump({"config": cfg, "workers": a.workers or cfg.get("workers", 4),
                   "stop_at": stop_at, "n_jobs": len(jobs)}, f, indent=2)
    recs = run_jobs(jobs, out, workers=a.workers or cfg.get("workers", 4),
                    threads=a.threads or cfg.get("threads", 1), stop_at=stop_at,
                    min_start_s=cfg.get("min_start_s", 20.0),
                    eval_margin_s=cfg.get("eval_margin_s", 10.0),
                    max_tasks_per_child=cfg.get("max_tasks_per_child"),
                    retry_without_amp=cfg.get("retry_without_amp", False),
                    pause=bool(cfg.get("pause", False)))
    return 0 if all(r["status"] != "error" for r in recs) else 1


def add_launch_args(p):
    p.add_argument("--config", default=None, help="JSON/YAML launch config (groups of sweeps)")
    p.add_argument("--out", default=None, help="output dir (default: the config's out_dir)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: config's)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per process (1)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="the whole batch ends this many seconds from now")
    p.add_argument("--stop-at", type=float, default=None, help="... or at this unix time")
    p.add_argument("--only", nargs="+", default=None, help="run only these groups")
    p.add_argument("--limit", type=int, default=None, help="first N jobs only")
    p.add_argument("--override", nargs=2, action="append", metavar=("FIELD", "JSON"),
                   help="set a TrainConfig field in every job (e.g. --override epochs 2)")
    p.add_argument("--dry-run", action="store_true", help="list the jobs and exit")
    p.add_argument("--summarize", nargs="+", default=None, metavar="JSONL",
                   help="print the summary table of one or more results.jsonl files and exit")
    p.add_argument("--merge-groups", action="store_true",
                   help="with --summarize: one row per task x model, best over all groups and files")

