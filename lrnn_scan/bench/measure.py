"""Timing, peak memory, copy bandwidth and environment description for the benchmarks.

* Time: CUDA — ``triton.testing.do_bench`` medians (L2 flushed between runs) or, without
  Triton, CUDA-event medians; CPU — ``time.perf_counter`` medians over ``rep`` runs after
  ``warmup`` runs.
* Peak memory: CUDA — ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``,
  minus what was allocated before the call (``mem_method="cuda.max_memory_allocated"``); CPU —
  the high-water mark of tensor allocations during one call, summed from ``torch.profiler``
  memory events (``mem_method="torch.profiler(profile_memory)"``). ``tracemalloc`` is *not* used:
  it only sees Python's allocator, not torch's CPU tensors.
* Copy bandwidth: ``dst.copy_(src)`` on the benchmark device, bytes read + written per second.

The CUDA branches ran on an H200 (``lrnn-scan bench`` views A, B, C, 2026-11-22:
``benchmarks/RESULTS.md``).
"""
from __future__ import annotations

import datetime as _dt
import platform
import statistics
import time
from typing import Callable

import torch

__all__ = ["device_label", "sync", "time_fn", "graph_time", "graph_copy", "kernel_times", "peak_memory",
           "copy_bandwidth", "environment"]


def device_label(device: torch.device) -> str:
    """``"CPU"`` or ``"CUDA"`` (put in every row, file name and plot title)."""
    return "CUDA" if torch.device(device).type == "cuda" else "CPU"


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def graph_time(fn: Callable[[], object], *, rep: int = 20, return_mode: str = "median") -> float:
    """``triton.testing.do_bench_cudagraph(fn)`` after ``torch.cuda.synchronize()``: milliseconds of
    CUDA-graph replays of ``fn`` (GPU time, no host launch cost).

    The synchronisation is not optional. ``do_bench_cudagraph`` runs ``fn`` on a new side stream
    without waiting for the current one, while ``fn``'s tensors may sit in blocks the caching
    allocator recycled from temporaries that kernels still queued on the default stream are
    reading. On 2026-11-25 (H100, Triton 3.6) ``dst.copy_(src)`` timed that way wrote into the
    temporary of ``A / A.sum(-1, keepdim=True)`` while ``* 0.99`` was reading it, so the benchmark's
    ``A`` became un-normalised and its scans overflowed (kernels/block_diagonal/README.md,
    "The NaN at B1 T16384 N768, m = 8")."""
    from triton.testing import do_bench_cudagraph

    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=rep, return_mode=return_mode)


def graph_copy(src: torch.Tensor, dst: torch.Tensor) -> Callable[[], object]:
    """A copy of ``src`` into ``dst`` to time with ``graph_time``: ``torch.neg(src, out=dst)``, an
    elementwise kernel that moves the same bytes. ``dst.copy_(src)`` is a ``cudaMemcpyAsync``; in a
    CUDA graph it can become a memcpy node run by the copy engines, on an H200 (2026-11-28,
    torch 2.11) 2.75 TB/s at 0.8 and 6.4 GB moved against 4.12-4.29 eagerly, while ``neg`` took
    4.23-4.26 TB/s both ways. So a graph-timed ``copy_`` understates the copy bandwidth (and
    overstates a "% of copy") by up to 1.55x."""
    return lambda: torch.neg(src, out=dst)


def kernel_times(fn: Callable[[], object], device, *, iters: int = 5) -> dict[str, tuple[float, float]]:
    """Where the time of ``fn()`` goes: ``{name: (calls per call of fn, microseconds per call of fn)}``
    from ``torch.profiler`` over ``iters`` calls after one untimed call, largest first. CUDA: the
    device kernels (self device time); CPU: the operators (self CPU time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as p:
        for _ in range(iters):
            fn()
        sync(device)
    out = {}
    for e in p.key_averages():
        if cuda and e.device_type != DeviceType.CUDA:
            continue
        t = e.self_device_time_total if cuda else e.self_cpu_time_total
        if t > 0:
            out[e.key] = (e.count / iters, t / iters)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def time_fn(fn: Callable[[], object], device, *, warmup: int = 1, rep: int = 3) -> float:
    """Median milliseconds of ``fn()`` on ``device``.

    CPU: ``warmup`` untimed runs, then the median of ``rep`` timed runs. CUDA with Triton:
    ``do_bench(fn, warmup=warmup, rep=rep)`` where both are *milliseconds* of benchmarking."""
    device = torch.device(device)
    if device.type == "cuda":  # NOT YET RUN ON A GPU
        try:  # warmup / rep are milliseconds for do_bench
            from triton.testing import do_bench
            return float(do_bench(fn, warmup=max(warmup, 1), rep=max(rep, 1),
                                  return_mode="median"))
        except ImportError:
            pass
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(rep):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        return float(statistics.median(times))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(rep, 1)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(times))


def _cpu_peak_bytes(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    items = []
    for e in prof.events():
        if e.name == "[memory]":                 # frees (and some allocations) outside any op
            items.append((e.time_range.start, e.cpu_memory_usage))
        elif e.self_cpu_memory_usage:            # net allocation of an op itself
            items.append((e.time_range.start, e.self_cpu_memory_usage))
    items.sort(key=lambda t: t[0])
    cur = peak = 0
    for _, nbytes in items:
        cur += nbytes
        peak = max(peak, cur)
    return int(peak)


def peak_memory(fn: Callable[[], object], device) -> tuple[float, str]:
    """``(peak MiB allocated during one call of fn, method)``."""
    device = torch.device(device)
    if device.type == "cuda":  # NOT YET RUN ON A GPU
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20, "cuda.max_memory_allocated"
    try:
        return _cpu_peak_bytes(fn) / 2**20, "torch.profiler(profile_memory)"
    except Exception as exc:  # pragma: no cover - profiler unavailable
        return float("nan"), f"unavailable ({type(exc).__name__})"


def copy_bandwidth(device, nbytes: int | None = None, *, warmup: int = 2, rep: int = 5) -> float:
    """Device copy bandwidth in GB/s (bytes read + written), measured now on ``device``."""
    device = torch.device(device)
    if nbytes is None:
        nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = time_fn(lambda: dst.copy_(src), device, warmup=warmup, rep=rep)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device) -> dict:
    """Device, versions and date (UTC) for the result files."""
    device = torch.device(device)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - optional on CPU
        triton_version = "not installed"
    if device.type == "cuda":  # NOT YET RUN ON A GPU
        props = torch.cuda.get_device_properties(device)
        name = f"{props.name} ({props.multi_processor_count} SMs)"
    else:
        name = f"{_cpu_name()} ({torch.get_num_threads()} threads)"
    return dict(device_label=device_label(device), device=name, torch=torch.__version__,
                triton=triton_version, python=platform.python_version(),
                date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
