"""The m = 1 scan (``diagonal_scan``) against accelerated-scan, same run, per forward tile.

Issue 3 asks the m = 1 scan to be at least as fast as accelerated-scan's Triton scan. The full
``scan_throughput.py`` run of 2026-11-25 (H100) had ours at 0.932x (fwd) and 0.934x (fwd+bwd) of
its speed at B8 T2048 N4096. The forward tile is chosen per GPU (``scan._DIAG_BY_DEVICE``); this
times the default, the other tiles and accelerated-scan in interleaved rounds (CUDA-graph
medians, GPU time only) and checks every forward against a float64 loop and every gradient
against the default's.

    python tools/diag_tile_vs_accel.py [--shapes 8x2048x4096 8x16384x4096] [--rounds 3] [--out DIR] \
        [--configs default fwd_64x32] [--tune w4=num_warps_diag:4]

``--configs`` picks columns of ``CONFIGS`` (default: all); ``--tune`` adds columns of ``scan.TUNE``
overrides (``tune_compare.py``'s syntax).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

from lrnn_scan.bench.measure import graph_time
from lrnn_scan.kernels.block_diagonal import diagonal_scan
from lrnn_scan.kernels.block_diagonal import scan as S
from lrnn_scan.kernels._host import row_by_name
from lrnn_scan.kernels.block_diagonal import tma

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from scan_peers import accelerated_scan_grad_ok, try_accelerated_scan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_compare import parse_tune  # noqa: E402

DEVICE = "cuda"       # the CPU smoke test (tests/test_tools_results.py) sets "cpu" (interpreter)
BENCH = graph_time

CONFIGS = {   # name -> scan.TUNE overrides (bt / bn / num_warps_diag set the backward's tiles too)
    "default": {},
    "fwd_64x32": dict(bt=64, bn=32, num_warps_diag=2, bt_bwd=64, bn_bwd=32, nw_bwd=4),  # before
    "bwd_64x32": dict(bt_bwd=64, bn_bwd=32),              # the backward's tiles before 2026-11-25
    "tiles_16x64_nw4": dict(bt=16, bn=64, num_warps_diag=4),
    # Removed after losing on an H100 and an H200: 16 x 128 and 32 x 128 with 4 warps, 8 x 64 with
    # 2 (0.81-0.96x); the forward's loads two tiles ahead (TUNE["diag_prefetch"] = 2, commit
    # b594a75), 0.965-1.000x the default's speed on an H100 (2026-11-26, twelfth session)
}


def flushed_timer(mb: int, timer=None, device=None):
    """A ``BENCH`` whose every replay first overwrites ``mb`` MB (``zero_``: the 50-60 MB L2 holds
    none of the kernel's data, nor dirty lines of the last replay's stores, when it starts), minus
    the graph time of that overwrite alone (whose write-backs of the kernel's dirty lines are
    then charged to the kernel). ``triton.testing.do_bench`` clears the cache the same way, but
    eagerly, with the host's launch cost inside the time. ``timer`` / ``device``: default this
    module's ``BENCH`` / ``DEVICE``."""
    timer = BENCH if timer is None else timer
    buf = torch.empty(mb * 2 ** 20 // 4, dtype=torch.int32, device=DEVICE if device is None else device)

    def bench(fn, rep, return_mode):
        both = timer(lambda: (buf.zero_(), fn())[1], rep=rep, return_mode=return_mode)
        return both - timer(buf.zero_, rep=rep, return_mode=return_mode)
    return bench


def random_inputs(shape: str, device, dtype=torch.float32):
    """``a`` uniform in [0.5, 1) and ``x`` standard normal, ``(B, T, N)`` from ``"BxTxN"``, drawn
    in fp32 and rounded to ``dtype``, with the generator (seed 0) that drew them."""
    B, T, N = map(int, shape.split("x"))
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.rand(B, T, N, device=device, generator=g) * 0.5 + 0.5
    return a.to(dtype), torch.randn(B, T, N, device=device, generator=g).to(dtype), g


def _ref64(a, b):
    h = torch.zeros_like(b[:, 0], dtype=torch.float64)
    out = torch.empty(b.shape, dtype=torch.float64, device=b.device)
    a64, b64 = a.double(), b.double()
    for t in range(b.shape[1]):
        h = a64[:, t] * h + b64[:, t]
        out[:, t] = h
    return out


def _rel(x, y):
    x, y = x.double(), y.double()
    return ((x - y).square().mean().sqrt() / y.square().mean().sqrt()).item()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["8x2048x4096", "8x16384x4096"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="gpu_out")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                    help="columns of CONFIGS (the first is the gradients' reference)")
    ap.add_argument("--tune", nargs="*", default=[], help="extra columns NAME=JSON of TUNE overrides")
    ap.add_argument("--flush-l2", type=int, default=0, metavar="MB",
                    help="overwrite MB megabytes before each replay and subtract its time (flushed_timer)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="of a, b, h and the gradients (the state stays fp32)")
    a_ = ap.parse_args(argv)
    configs = {n: CONFIGS[n] for n in a_.configs}
    extra = parse_tune(a_.tune)
    if set(extra) & set(configs):
        raise SystemExit(f"--tune names {sorted(set(extra) & set(configs))} repeat --configs names")
    configs.update(extra)
    out = Path(a_.out)
    out.mkdir(parents=True, exist_ok=True)
    as_scan = try_accelerated_scan()
    bench = flushed_timer(a_.flush_l2) if a_.flush_l2 else BENCH
    dev = torch.device(DEVICE)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU interpreter"
    env = dict(device=name,
               torch=torch.__version__, triton=triton.__version__,
               date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               default_fwd_tile=S._diag_default(dev),
               tma_many_programs=(row_by_name(tma._MANY_BY_DEVICE, name) or {}).get(
                   getattr(torch, a_.dtype).itemsize), flush_l2_mb=a_.flush_l2,
               dtype=a_.dtype)
    print(env, flush=True)
    rows = []
    for shape in a_.shapes:
        a, x, g = random_inputs(shape, dev, getattr(torch, a_.dtype))
        B, T, N = a.shape
        dh = torch.randn(B, T, N, device=dev, generator=g).to(a.dtype)
        ref = _ref64(a[:1], x[:1])
        fns, checks, grads0 = {}, {}, None
        ag, xg = a.clone().requires_grad_(), x.clone().requires_grad_()    # shared by the configs
        for name, tune in configs.items():
            with S.tuned(tune):
                h, _ = diagonal_scan(a, x)
                grads = torch.autograd.grad(diagonal_scan(ag, xg)[0], (ag, xg), dh)
            grads0 = grads0 or grads
            checks[name] = dict(h_vs_fp64=_rel(h[:1], ref),
                                grad_vs_default=max(_rel(u, v) for u, v in zip(grads, grads0)))
            del h, grads

            def fwd(tune=tune):
                with S.tuned(tune):
                    return diagonal_scan(a, x)

            def fwdbwd(tune=tune):
                with S.tuned(tune):
                    return torch.autograd.grad(diagonal_scan(ag, xg)[0], (ag, xg), dh)
            fns[name] = (fwd, fwdbwd)
        if as_scan is not None:   # its layout is (B, N, T): transposed once, outside the timing
            at, xt = a.transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous()
            atg, xtg = at.clone().requires_grad_(), xt.clone().requires_grad_()
            dht = dh.transpose(1, 2).contiguous()
            checks["accelerated-scan"] = dict(h_vs_fp64=_rel(as_scan(at[:1], xt[:1]).transpose(1, 2), ref))
            grad_ok = accelerated_scan_grad_ok(T)
            if not grad_ok:
                print(f"accelerated-scan fwd+bwd not timed at T{T}: its backward reads past its "
                      "states unless T % 2048 == 0 (scan_peers.accelerated_scan_grad_ok)", flush=True)
            fns["accelerated-scan"] = (lambda: as_scan(at, xt), (lambda: torch.autograd.grad(
                as_scan(atg, xtg), (atg, xtg), dht)) if grad_ok else None)
        times = {(n, k): [] for n in fns for k in ("fwd", "fwdbwd")}
        for _ in range(a_.rounds):        # interleaved: drift hits every config alike
            for n, (f, fb) in fns.items():
                times[(n, "fwd")].append(bench(f, rep=40, return_mode="median"))
                if fb is not None:
                    times[(n, "fwdbwd")].append(bench(fb, rep=40, return_mode="median"))
        for kind in ("fwd", "fwdbwd"):
            peer_times = times.get(("accelerated-scan", kind))
            peer = statistics.median(peer_times) if peer_times else None
            for n in fns:
                if not times[(n, kind)]:
                    continue
                ms = statistics.median(times[(n, kind)])
                nbytes = B * T * N * a.element_size() * (3 if kind == "fwd" else 6)
                rows.append(dict(B=B, T=T, N=N, kind=kind, config=n, tune=configs.get(n, "peer"),
                                 graph_ms=round(ms, 5), rounds=[round(v, 5) for v in times[(n, kind)]],
                                 tbs=round(nbytes / ms / 1e9, 3),
                                 peer_over_this=round(peer / ms, 3) if peer else None, **checks[n]))
                print(f"B{B} T{T} N{N} {kind:6s} {n:18s} {ms:8.4f} ms  {nbytes / ms / 1e9:6.3f} TB/s  "
                      f"accelerated-scan/this {rows[-1]['peer_over_this']}  checks {checks[n]}", flush=True)
        del a, x, dh, ag, xg, fns, grads0
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    path = out / "diag_tile_vs_accel.json"
    path.write_text(json.dumps(dict(**env, rows=rows), indent=1, default=str))
    with open(out / "RESULTS_diagtile.md", "a") as f:
        f.write(f"\n## tools/diag_tile_vs_accel.py, {env['date']}\n\n{env['device']}, torch {env['torch']}, "
                f"Triton {env['triton']}; {a_.dtype}; default forward tile here {env['default_fwd_tile']} (tile kernel"
                + (f"; by programs an SM the default may be the TMA forward, ((lo, hi), tile) "
                   f"{env['tma_many_programs']} from T >= {tma._MANY_MIN_T}, tma._MANY_BY_DEVICE"
                   if env["tma_many_programs"] else "") + "); "
                f"graph ms = median over {a_.rounds} interleaved rounds of do_bench_cudagraph medians"
                + (f" (each replay after a {a_.flush_l2} MB overwrite, whose own graph time is subtracted)"
                   if a_.flush_l2 else "") + "; "
                "TB/s = inputs once + outputs once; accelerated-scan/this > 1: ours faster.\n\n"
                "| B | T | N | kind | config | TUNE | graph ms | TB/s | accelerated-scan / this | "
                "h vs fp64 | grads vs default |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['B']} | {r['T']} | {r['N']} | {r['kind']} | {r['config']} | {r['tune'] or '—'} | "
                    f"{r['graph_ms']} | {r['tbs']} | {r['peer_over_this']} | {r['h_vs_fp64']:.1e} | "
                    f"{r.get('grad_vs_default', float('nan')):.1e} |\n")
    print(f"wrote {path} and {out}/RESULTS_diagtile.md", flush=True)


if __name__ == "__main__":
    main()
