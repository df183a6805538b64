"""Training harness: one run (:func:`train`) and an LR × seed grid (:func:`run_grid`).

Protocol (``shared/reference/tasks.md`` §1): AdamW (0.9, 0.999, 1e-8), a per-step cosine schedule
from ``lr`` to ``min_lr`` (1e-5) that is really applied to the optimizer (checked in the tests),
batch 128, early stop once the test accuracy reaches ``early_stop`` (0.999), bf16 autocast on CUDA
only. Metrics on the test set: ``micro`` (scored tokens correct / scored tokens), ``macro`` (mean
per-class recall over the classes that occur as target or prediction, MAD's torchmetrics metric;
computed over the whole test set, where MAD averages per-batch values), ``seq`` (all scored positions of a sequence right), ``scaled`` =
``(micro − chance)/(1 − chance)`` (for Chomsky tasks).

Checkpoints (``out_dir/checkpoint.pt``, written atomically after every epoch) hold the model,
optimizer, scheduler, torch and numpy RNG states, the epoch counter and the history; the data
order of epoch ``e`` is a pure function of ``(seed, e)``, so a run resumed from a checkpoint
reproduces the uninterrupted run exactly (on the same device). ``out_dir/log.jsonl`` gets one JSON
line per epoch (and a ``start``/``end`` line).

Wall-time limits (single process; used by :mod:`.launch`): ``time_budget_s`` cuts the number of
epochs after epoch 1 to what fits the budget (the cosine is shortened to end at ``min_lr`` after
them; ``epochs_planned`` in the result); ``stop_at`` (unix time, a runtime field) ends the run
after the current step once passed, evaluates it and marks it ``time_limited`` (such a run is
final: it is not resumed). ``pause_at`` (unix time, runtime, needs ``out_dir``) instead stops at
the last epoch boundary before it without changing the schedule: the result is ``paused`` (not
``complete``) and a later call with the same ``out_dir`` continues the run, so a schedule longer
than one machine session is trained in pieces with the uninterrupted run's result.

Under ``torchrun`` (``WORLD_SIZE > 1``; see :mod:`.distributed`) the same loop runs on every rank:
data parallel (DDP over row shards of each global batch) or, with ``sequence_parallel=True``, over
time shards of it with the layers' scans across ranks. Either way the update is the
single-process update of the global batch (up to rounding), the test metrics are reduced over the
ranks, and only rank 0 prints and writes ``out_dir``.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from . import distributed as _dist
from .metrics import _autocast, _upcast, evaluate
from .layers import build_layer, canonical_model_name
from .tasks import TaskData, canonical_task_name, make_task
from .wrappers import build_model, set_sequence_parallel

__all__ = ["TrainConfig", "train", "run_grid", "evaluate", "build_for_config", "Progress",
           "load_checkpoint"]


@dataclass
class TrainConfig:
    # task
    task: str = "s3"
    task_kwargs: dict = field(default_factory=dict)
    data_seed: int = 0
    # model
    model: str = "bdlru"
    block_size: int | None = None
    hidden_size: int = 120
    gate: str | None = None
    layer_kwargs: dict = field(default_factory=dict)
    layer_source: str = "models"           # "models" (lrnn_scan.models if present) | "reference"
    d_model: int = 64
    n_layers: int = 1
    mlp_ratio: float = 2.0
    # optimisation
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_steps: int = 0
    grad_clip: float | None = None
    batch_size: int = 128
    epochs: int = 20
    steps_per_epoch: int | None = None     # streaming (Chomsky) tasks; default 100
    seed: int = 0
    early_stop: float | None = 0.999
    stop_metric: str = "micro"             # micro | macro
    # runtime
    device: str = "auto"
    amp: str = "auto"                      # auto (bf16 on CUDA) | bf16 | off
    num_threads: int | None = None
    eval_batch_size: int | None = None
    out_dir: str | None = None
    resume: bool = True
    progress: str = "auto"                 # auto | bar | print | none
    sequence_parallel: bool = False        # under torchrun: time shards instead of row shards
    # wall-time limits (GPU batches of many runs, see launch.py)
    time_budget_s: float | None = None     # after epoch 1: cut `epochs` so the run fits this
                                           # budget; the cosine then spans the reduced epochs
    stop_at: float | None = None           # unix time: stop (after the current step, then
                                           # evaluate) once passed; result "time_limited"
    pause_at: float | None = None          # unix time: stop at the last epoch boundary before it
                                           # (checkpoint kept, result "paused"); the next call
                                           # with the same out_dir resumes the same schedule

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(d["betas"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - names
        if bad:
            raise ValueError(f"unknown TrainConfig field(s) {sorted(bad)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    # fields that do not change the result (allowed to differ on resume)
    _RUNTIME = ("out_dir", "resume", "progress", "num_threads", "eval_batch_size",
                "sequence_parallel", "stop_at", "pause_at")

    def identity(self) -> dict:
        d = self.to_dict()
        for k in self._RUNTIME:
            d.pop(k, None)
        return d


# ----------------------------------------------------------------------------- progress
class Progress:
    """Optional tqdm bar (if tqdm is installed), else plain prints."""

    def __init__(self, mode: str, total: int, desc: str):
        self.mode = mode
        if mode == "auto":
            try:
                import tqdm  # noqa: F401
                self.mode = "bar" if sys.stderr.isatty() else "print"
            except ImportError:
                self.mode = "print"
        self.bar = None
        if self.mode == "bar":
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, desc=desc, leave=False)
            except ImportError:
                self.mode = "print"
        self.desc = desc

    def update(self, n=1, **post):
        """Advance by ``n``; ``post`` values that are not ``None`` go to the bar's postfix (a
        device tensor costs a host sync: pass one every few dozen steps)."""
        post = {k: v for k, v in post.items() if v is not None}
        if self.bar is not None:
            self.bar.update(n)
            if post:
                self.bar.set_postfix({k: f"{float(v):.4g}" for k, v in post.items()},
                                     refresh=False)

    def log(self, msg: str):
        if self.mode == "none":
            return
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------- building
def build_for_config(cfg: TrainConfig, task: TaskData | None = None):
    """``(task, model)`` for a config (model on CPU, freshly initialised from ``cfg.seed``)."""
    if task is None:
        task = make_task(cfg.task, cfg.data_seed, **cfg.task_kwargs)
    torch.manual_seed(cfg.seed)
    layers = [build_layer(cfg.model, cfg.d_model, hidden_size=cfg.hidden_size,
                          block_size=cfg.block_size, gate=cfg.gate, prefer=cfg.layer_source,
                          **cfg.layer_kwargs) for _ in range(cfg.n_layers)]
    model = build_model(task.arch, task.vocab_size, task.n_out, cfg.d_model, layers,
                        cfg.mlp_ratio)
    return task, model


def _lr_lambda(cfg: TrainConfig, total_steps):
    """Cosine from ``lr`` to ``min_lr`` over ``total_steps`` (an int, or a one-element list that
    may be shortened during the run: ``time_budget_s``)."""
    base, lo, warm = cfg.lr, min(cfg.min_lr, cfg.lr), cfg.warmup_steps
    holder = total_steps if isinstance(total_steps, list) else [total_steps]

    def f(step: int) -> float:
        total_steps = holder[0]
        if warm and step < warm:
            return (step + 1) / warm
        t = min(step - warm, max(1, total_steps - warm - 1)) / max(1, total_steps - warm - 1)
        return (lo + (base - lo) * 0.5 * (1.0 + math.cos(math.pi * t))) / base
    return f


# ----------------------------------------------------------------------------- checkpoints
def _atomic_save(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str):
    """``(cfg, task, model, ckpt)`` rebuilt from a checkpoint file (model on CPU)."""
    ck = torch.load(path, map_location="cpu", weights_only=False)
    cfg = TrainConfig.from_dict(ck["config"])
    task, model = build_for_config(cfg)
    model.load_state_dict(ck["model"])
    return cfg, task, model, ck


class _Logger:
    def __init__(self, out_dir):
        self.path = os.path.join(out_dir, "log.jsonl") if out_dir else None

    def __call__(self, **rec):
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")


# ----------------------------------------------------------------------------- training
def train(cfg: TrainConfig | dict, task: TaskData | None = None, *,
          _stop_after_epochs: int | None = None) -> dict:
    """Train one model; return a result dict (best/final metrics, history, timings).

    ``task`` may be passed to reuse generated data across runs (it must match ``cfg``).
    ``_stop_after_epochs`` simulates an interruption (for the resume tests).
    """
    if isinstance(cfg, dict):
        cfg = TrainConfig.from_dict(cfg)
    canonical_model_name(cfg.model)
    canonical_task_name(cfg.task)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    # under torchrun: join the process group; "dp" (row shards + DDP) or "sp" (time shards)
    dinfo, device = _dist.setup(cfg.device, cfg.sequence_parallel)
    if dinfo.active and (cfg.time_budget_s or cfg.stop_at or cfg.pause_at):
        raise ValueError("time_budget_s / stop_at / pause_at are single-process options (the ranks "
                         "would stop at different steps)")
    if cfg.pause_at is not None and not cfg.out_dir:
        raise ValueError("pause_at needs out_dir: a paused run continues from its checkpoint")
    main = dinfo.main
    t0 = time.time()
    task, model = build_for_config(cfg, task)
    model.to(device)
    if dinfo.mode == "sp":
        set_sequence_parallel(model, dinfo.group)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # fused AdamW on CUDA: one kernel for all parameters instead of a foreach launch per group
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                            fused=device.type == "cuda" or None)
    if task.streaming:
        steps_per_epoch = cfg.steps_per_epoch or 100
        Xtr = Ytr = None
    else:
        # the whole training set lives on the device (our tasks are a few MB): a batch is a
        # gather there, not a pageable host-to-device copy (which synchronises the stream)
        Xtr = torch.as_tensor(task.train[0]).to(device)
        Ytr = torch.as_tensor(task.train[1]).to(device)
        steps_per_epoch = math.ceil(len(Xtr) / cfg.batch_size)
    total_steps = [steps_per_epoch * cfg.epochs]      # shortened by time_budget_s after epoch 1
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg, total_steps))
    stream_rng = np.random.default_rng(np.random.SeedSequence([int(cfg.data_seed), 7,
                                                               int(cfg.seed)]))
    eval_batches = task.test
    if cfg.eval_batch_size:
        eval_batches = _rebatch(task.test, cfg.eval_batch_size)

    state = {"epoch": 0, "step": 0, "history": [], "best": None, "best_epoch": None,
             "stopped_early": False, "train_time": 0.0, "epochs_planned": cfg.epochs,
             "time_limited": False, "wall_time": 0.0}
    out_dir = cfg.out_dir
    ck_path = os.path.join(out_dir, "checkpoint.pt") if out_dir else None
    if out_dir and main:
        os.makedirs(out_dir, exist_ok=True)
    log = _Logger(out_dir if main else None)          # only rank 0 writes logs / checkpoints
    resumed = False
    do_resume = bool(ck_path and cfg.resume and os.path.exists(ck_path))
    clear_log = bool(ck_path and not cfg.resume
                     and os.path.exists(os.path.join(out_dir, "log.jsonl")))
    if dinfo.active:        # rank 0 decides for all; every rank loads the same checkpoint
        decision = [do_resume, clear_log]
        torch.distributed.broadcast_object_list(decision, src=0)
        do_resume, clear_log = decision
        torch.distributed.barrier()
    if do_resume:
        ck = torch.load(ck_path, map_location="cpu", weights_only=False)
        if TrainConfig.from_dict(ck["config"]).identity() != cfg.identity():
            raise ValueError(f"{ck_path} was written by a different configuration; use another "
                             f"out_dir or --no-resume")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        torch.set_rng_state(ck["torch_rng"])
        if device.type == "cuda" and ck.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ck["cuda_rng"], device)
        stream_rng.bit_generator.state = ck["stream_rng"]
        state = ck["state"]
        state.setdefault("epochs_planned", cfg.epochs)
        state.setdefault("time_limited", False)
        state.setdefault("wall_time", 0.0)     # checkpoints before 2026-11-25 did not keep it
        total_steps[0] = steps_per_epoch * state["epochs_planned"]
        resumed = True
    elif clear_log:
        if main:
            os.remove(os.path.join(out_dir, "log.jsonl"))
    else:
        torch.manual_seed(cfg.seed + 1)       # training-time randomness (none by default)

    # wall time summed over the calls that ran this run (a resumed run reports all of it)
    wall_before = state["wall_time"]
    desc = f"{task.name}/{cfg.model}" + (f"-m{cfg.block_size}" if cfg.block_size else "")
    prog = Progress(cfg.progress if main else "none", total_steps[0], desc)
    src = getattr(model.blocks[0].layer, "layer_source", "?")
    if resumed:
        prog.log(f"[{desc}] resumed from {ck_path} at epoch {state['epoch']}")
    else:
        prog.log(f"[{desc}] {n_params:,} parameters (layer from {src}), {steps_per_epoch} "
                 f"steps/epoch x {cfg.epochs} epochs, lr={cfg.lr:g}, seed={cfg.seed}, "
                 f"device={device.type}"
                 + (f", {dinfo.world} ranks ({'sequence' if dinfo.mode == 'sp' else 'data'} "
                    "parallel)" if dinfo.active else ""))
        log(event="start", config=cfg.to_dict(), n_params=n_params, layer_source=src,
            task_info=task.info)
    prog.update(state["step"])
    net = model                                       # what the training step calls
    if dinfo.mode == "dp":
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model, device_ids=[device.index]
                                      if device.type == "cuda" else None)
    model.train()
    ctx = _autocast(cfg, device)
    epochs_this_call = 0
    paused = False
    while (state["epoch"] < state["epochs_planned"] and not state["stopped_early"]
           and not state["time_limited"]):
        # pause_at: stop at this epoch boundary if another epoch (as long as the last one,
        # evaluation included) would end after it; the checkpoint of the last epoch is on disk
        if (cfg.pause_at is not None and state["history"]
                and time.time() + state["history"][-1]["epoch_time"] > cfg.pause_at):
            paused = True
            break
        epoch = state["epoch"]
        te = time.time()
        n_done = 0
        t_step5 = None                  # wall clock after 5 steps (they include compilation)
        # the epoch's loss sum and token count stay on the device: no host sync per step
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        n_tok_dev = torch.zeros((), dtype=torch.int64, device=device)
        n_tok = 0
        if task.streaming:
            batches = (task.sample_train(stream_rng, cfg.batch_size)
                       for _ in range(steps_per_epoch))
        else:
            g = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + epoch)
            perm = torch.randperm(len(Xtr), generator=g).to(device)
            batches = ((Xtr[perm[i:i + cfg.batch_size]], Ytr[perm[i:i + cfg.batch_size]])
                       for i in range(0, len(Xtr), cfg.batch_size))
        for X, Y in batches:
            if cfg.stop_at is not None and time.time() > cfg.stop_at and n_done:
                state["time_limited"] = True          # deadline: evaluate what we have
                break
            X = _to_device(X, device)
            Y = _to_device(Y, device)
            if dinfo.active:
                # X, Y: the global batch (identical on every rank); this rank's share of it
                ce, k = _distributed_step(net, model, X, Y, opt, ctx, dinfo, device)
                loss_sum += ce.to(device)
                n_tok += k
                loss = ce / max(k, 1)
            else:
                with ctx:
                    logits = model(X)
                # ignore_index instead of a boolean mask: same mean over the scored tokens, no
                # data-dependent shape (which would synchronise with the device every step)
                loss = F.cross_entropy(_upcast(logits).flatten(0, -2), Y.flatten(),
                                       ignore_index=-100)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            state["step"] += 1
            n_done += 1
            if not dinfo.active:
                k = (Y != -100).sum()
                loss_sum += loss.detach().double() * k
                n_tok_dev += k
            prog.update(1, loss=loss if n_done % 50 == 0 else None)
            if n_done == 5:
                t_step5 = time.time()
        if not dinfo.active:
            n_tok = int(n_tok_dev)                        # the epoch's one sync
        loss_sum = loss_sum.cpu()
        t_train_end = time.time()
        t_step = ((t_train_end - t_step5) / (n_done - 5) if t_step5 and n_done > 5
                  else (t_train_end - te) / max(n_done, 1))
        if dinfo.active:
            tot = _dist.all_reduce_sum(torch.stack([loss_sum, torch.tensor(float(n_tok),
                                                    dtype=torch.float64)]), device)
            loss_sum, n_tok = tot[0], int(round(float(tot[1])))
        state["train_time"] += time.time() - te
        t_eval = time.time()
        metrics = evaluate(model, eval_batches, task.n_out, device, cfg,
                           task.chance if task.scaled else 0.0,
                           dist_info=dinfo if dinfo.active else None)
        t_eval = time.time() - t_eval
        state["epoch"] = epoch + 1
        # epochs of 5 steps or fewer (e.g. S3 with 250 sequences: 2 steps) are timed in epoch 2:
        # epoch 1's whole time is then compilation (2026-11-25: 1.5 s "per step" against 0.02 s)
        fit_at = 0 if steps_per_epoch > 5 or cfg.epochs <= 2 else 1
        if cfg.time_budget_s and epoch == fit_at and not resumed:
            _fit_epochs_to_budget(cfg, state, t_step, t_eval, time.time() - t0,
                                  steps_per_epoch, total_steps, epochs_done=epoch + 1)
        rec = {"epoch": epoch + 1, "step": state["step"], "lr": opt.param_groups[0]["lr"],
               "train_loss": float(loss_sum) / max(n_tok, 1),
               **{f"test_{k}": v for k, v in metrics.items()},
               "epoch_time": time.time() - te}
        state["history"].append(rec)
        score = metrics[cfg.stop_metric]
        if state["best"] is None or score > state["best"][cfg.stop_metric]:
            state["best"], state["best_epoch"] = metrics, epoch + 1
        if cfg.early_stop is not None and score >= cfg.early_stop:
            state["stopped_early"] = True
        prog.log(f"[{desc}] epoch {epoch + 1}/{cfg.epochs} loss {rec['train_loss']:.4f} "
                 f"test micro {metrics['micro']:.4f} macro {metrics['macro']:.4f}"
                 + (f" scaled {metrics['scaled']:.4f}" if "scaled" in metrics else "")
                 + f" lr {rec['lr']:.2e} ({rec['epoch_time']:.1f}s)")
        log(event="epoch", **rec)
        if ck_path and main:
            state["wall_time"] = wall_before + time.time() - t0
            _atomic_save({"config": cfg.to_dict(), "model": model.state_dict(),
                          "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                          "torch_rng": torch.get_rng_state(),
                          "cuda_rng": (torch.cuda.get_rng_state(device)
                                       if device.type == "cuda" else None),
                          "stream_rng": stream_rng.bit_generator.state, "state": state},
                         ck_path)
        epochs_this_call += 1
        if _stop_after_epochs is not None and epochs_this_call >= _stop_after_epochs:
            break
    prog.close()
    if dinfo.active:        # rank 0's checkpoint is on disk before any rank returns
        torch.distributed.barrier()
    final = state["history"][-1] if state["history"] else {}
    best = state["best"] or {}
    result = {"task": task.name, "model": canonical_model_name(cfg.model),
              "block_size": cfg.block_size, "hidden_size": cfg.hidden_size, "lr": cfg.lr,
              "seed": cfg.seed, "epochs_run": state["epoch"], "steps": state["step"],
              "stopped_early": state["stopped_early"], "n_params": n_params,
              "layer_source": src, "best_epoch": state["best_epoch"],
              **{f"best_{k}": v for k, v in best.items()},
              **{f"final_{k[5:]}": v for k, v in final.items() if k.startswith("test_")},
              "final_lr": opt.param_groups[0]["lr"],
              "train_time_s": state["train_time"], "wall_time_s": wall_before + time.time() - t0,
              "epochs_planned": state["epochs_planned"], "time_limited": state["time_limited"],
              "paused": paused, "budget_estimate": state.get("budget_estimate"),
              "history": state["history"], "complete": state["epoch"] >= state["epochs_planned"]
              or state["stopped_early"] or state["time_limited"]}
    if result["complete"]:
        log(event="end", **{k: v for k, v in result.items() if k != "history"})
        prog.log(f"[{desc}] done: best test micro {best.get('micro', float('nan')):.4f} "
                 f"macro {best.get('macro', float('nan')):.4f} (epoch {state['best_epoch']}), "
                 f"{state['train_time']:.1f}s training")
    return result


def _fit_epochs_to_budget(cfg, state, t_step, t_eval, elapsed, steps_per_epoch,
                          total_steps, epochs_done=1):
    """After epoch 1 (epoch 2 when epochs have 5 steps or fewer): the number of epochs that fit
    ``cfg.time_budget_s`` (wall time since the start of :func:`train`), at least
    ``epochs_done`` and at most ``cfg.epochs``. ``t_step``: that epoch's mean step time (s), in
    epoch 1 after its first 5 steps (those include Triton compilation), read on the host clock
    after the epoch's one device sync, since the steps themselves do not wait for the device.
    The cosine schedule is shortened to the new total (it has run ``epochs_done`` epochs of the
    old, longer one). ``budget_estimate["epoch1_s"]`` is the wall time up to the fit."""
    t_epoch = steps_per_epoch * t_step + t_eval
    left = cfg.time_budget_s - elapsed
    fit = epochs_done + int(max(left, 0.0) // max(t_epoch, 1e-9))
    n = max(epochs_done, min(cfg.epochs, fit))
    state["epochs_planned"] = n
    state["budget_estimate"] = {"step_s": t_step, "eval_s": t_eval, "epoch1_s": elapsed,
                                "fitted_after_epoch": epochs_done}
    total_steps[0] = steps_per_epoch * n


def _distributed_step(net, model, X, Y, opt, ctx, dinfo, device):
    """Forward/backward of this rank's share of the global batch ``(X, Y)``; gradients are then
    the single-process gradients of the global batch's mean loss on every rank.

    Data parallel: rows ``shard_bounds(B)``; loss = local CE sum / global scored tokens × world
    (DDP averages). Sequence parallel: steps ``shard_bounds(T)``; loss = local CE sum / global
    scored tokens, gradients summed over the ranks. Returns ``(local CE sum (float64, CPU),
    local scored tokens)``."""
    n_glob = max(int((Y != -100).sum()), 1)
    weight = 1.0
    if dinfo.mode == "dp":
        lo, hi = _dist.shard_bounds(X.shape[0], dinfo.world, dinfo.rank)
        if hi == lo:            # fewer rows than ranks: join the collective with a 0-weight row
            lo, hi, weight = 0, 1, 0.0
        X, Y = X[lo:hi], Y[lo:hi]
    else:
        lo, hi = _dist.shard_bounds(X.shape[1], dinfo.world, dinfo.rank)
        X, Y = X[:, lo:hi], Y[:, lo:hi]
    with ctx:
        logits = net(X)
    mask = Y != -100
    ce = F.cross_entropy(_upcast(logits)[mask], Y[mask], reduction="sum") * weight
    scale = (dinfo.world if dinfo.mode == "dp" else 1) / n_glob
    opt.zero_grad(set_to_none=True)
    (ce * scale).backward()
    if dinfo.mode == "sp":
        _dist.sum_gradients(model.parameters(), device)
    return ce.detach().double().cpu(), int(mask.sum()) if weight else 0


def _to_device(x, device):
    """A batch (numpy or torch) on ``device``; host tensors go through pinned memory on CUDA so
    the copy is asynchronous (a pageable copy waits for the stream)."""
    x = torch.as_tensor(x)
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def _rebatch(batches, bs):
    out = []
    for X, Y in batches:
        for i in range(0, len(X), bs):
            out.append((X[i:i + bs], Y[i:i + bs]))
    return out


def run_grid(cfg: TrainConfig, lrs=(1e-3, 5e-4, 1e-4), seeds=(0, 1, 2, 3, 4),
             metric: str = "micro", task: TaskData | None = None) -> dict:
    """Train ``cfg`` for every ``lr × seed`` and return ``{"best": result, "runs": [...]}``;
    ``best`` maximises the best-epoch test ``metric`` (the paper's "best test accuracy over the
    LR grid × seeds"). Per-run output directories are ``out_dir/lr{lr}_seed{seed}``."""
    if task is None:
        task = make_task(cfg.task, cfg.data_seed, **cfg.task_kwargs)
    runs = []
    for lr in lrs:
        for seed in seeds:
            c = copy.deepcopy(cfg)
            c.lr, c.seed = float(lr), int(seed)
            if cfg.out_dir:
                c.out_dir = os.path.join(cfg.out_dir, f"lr{lr:g}_seed{seed}")
            runs.append(train(c, task))
    best = max(runs, key=lambda r: r.get(f"best_{metric}", -1.0))
    return {"best": best, "runs": runs}
