"""GPU time per kernel of one call (``torch.profiler``), for tables that set variants side by side:
``delta_throughput.py --variants ... --kernels`` reports, for each kernel of a forward+backward, its
microseconds under each ``function.TUNE`` variant, so a change to one kernel is read off that
kernel's row instead of the whole pass's time (where a few percent sit in run-to-run noise)."""
from __future__ import annotations

import torch


def kernel_times(call, reps=3, warmup=2):
    """``{kernel name: (microseconds, launches) per call of call()}`` for every GPU kernel ``call``
    launches, averaged over ``reps`` profiled calls after ``warmup`` unprofiled ones (compilation,
    autotuning). ``call`` runs the whole pass (e.g. a forward and its backward)."""
    from torch.profiler import ProfilerActivity, profile

    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    out = {}
    for ev in p.key_averages():
        # torch >= 2.4 names it device time; older builds cuda time
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = ev.self_cuda_time_total
        if us > 0:
            t, n = out.get(ev.key, (0.0, 0.0))
            out[ev.key] = (t + us / reps, n + ev.count / reps)
    return out


def kernel_rows(times_by_variant, top=12):
    """Rows ``[kernel, µs under each variant...]`` for the ``top`` kernels by their largest time
    under any variant (a kernel that only another variant launches, e.g. the one a variant swaps
    in, still gets its row), then a ``sum`` row over all kernels (those past ``top`` included).
    ``times_by_variant``: ``{variant: kernel_times(...)}`` in column order."""
    us = {name: {k: v[0] for k, v in t.items()} for name, t in times_by_variant.items()}
    keys = sorted(set().union(*us.values()), key=lambda k: -max(t.get(k, 0.0) for t in us.values()))[:top]
    rows = []
    for key in keys + ["sum"]:
        vals = [sum(t.values()) if key == "sum" else t.get(key, 0.0) for t in us.values()]
        label = key if key == "sum" else f"`{key[:60]}`"
        rows.append([label] + [f"{v:.1f}" for v in vals])
    return rows
