"""Spawned multi-rank test runs (gloo, CPU): one helper for the distributed test files.

Each worker ``fn(rank, world, store, *args)`` writes ``rank<r>.json`` in ``out_dir`` right
before ``destroy_process_group``. ``run_ranks`` returns those results. A rank fails the test
when it has no results file, or exits non-zero without a signal. A rank killed by a signal
after writing its results is tolerated with a warning: gloo's teardown aborted a rank there in
CI after every collective had finished ("terminate called without an active exception",
SIGABRT, tests/test_mad_tasks_distributed.py, 2026-11-29; a file store replaced TCP for the
earlier case of the same message). The processes are polled, not ``ctx.join``-ed: ``join``
SIGTERMs the other ranks at the first failure, possibly before they have written their
results.
"""
from __future__ import annotations

import json
import os
import time
import warnings


def run_ranks(fn, world: int, out_dir: str, args: tuple = (), timeout: float = 120.0) -> dict:
    """Runs ``fn(rank, world, store, *args)`` on ``world`` spawned processes (a fresh file store
    in ``out_dir``); returns ``{rank: results}`` from each rank's ``rank<r>.json`` in ``out_dir``.
    Raises ``TimeoutError`` after ``timeout`` seconds (the workers are killed) and
    ``AssertionError`` for a failed rank (module docstring)."""
    import torch.multiprocessing as mp
    store = os.path.join(out_dir, f"pg_store_{os.getpid()}_{time.monotonic_ns()}")
    ctx = mp.start_processes(fn, args=(world, store, *args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        for p in ctx.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.is_alive() for p in ctx.processes):
            raise TimeoutError(f"{world} workers did not finish in {timeout:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    out = {}
    for r, p in enumerate(ctx.processes):
        path = os.path.join(out_dir, f"rank{r}.json")
        assert os.path.exists(path), f"rank {r} exited with code {p.exitcode} before writing its results"
        assert p.exitcode is not None and p.exitcode <= 0, f"rank {r} exited with code {p.exitcode}"
        if p.exitcode < 0:
            warnings.warn(f"rank {r} was killed by signal {-p.exitcode} after writing its results "
                          "(gloo teardown)")
        with open(path) as fh:
            out[r] = json.load(fh)
    return out
