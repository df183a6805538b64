"""Throughput of the DeltaProduct chunkwise path (issue 4).

B=8, T=4096, H=16, K=V=128, bf16, n_h ∈ {1,2,3,4}, gated and ungated, forward and forward+backward,
medians of ``triton.testing.do_bench``. fla's ``chunk_gated_delta_product`` is timed in the same run
when importable; otherwise its H200 numbers from ``shared/reference/peers.md`` are printed as a
clearly labelled reference (not the same run, possibly not the same device).

Writes ``<out>/delta_throughput.{csv,json}`` and appends dated rows to ``benchmarks/RESULTS.md``.

    python benchmarks/delta_throughput.py [--nh 1 2 3 4] [--out benchmarks/out] [--results benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# fla's measurements (peers.md; one H200, torch 2.11, Triton 3.6) — reference only, not this run
PEERS_FLA_H200 = {  # (n_h, gated, mode) -> ms
    (1, True, "fwd"): 1.086, (1, False, "fwd"): 1.045, (1, False, "fwd+bwd"): 3.38,
    (2, True, "fwd"): 1.937, (2, False, "fwd"): 1.845, (2, False, "fwd+bwd"): 6.58,
    (3, True, "fwd"): 2.772, (3, False, "fwd"): 2.656, (3, False, "fwd+bwd"): 9.47,
    (4, False, "fwd"): 3.451, (4, False, "fwd+bwd"): 12.36,
}


def inputs(B, T, n_h, H, K, V, gated, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    d = "cuda"
    q = torch.randn(B, T, H, K, device=d, dtype=dtype)
    k = F.normalize(torch.randn(B, T, n_h, H, K, device=d, dtype=torch.float32), dim=-1).to(dtype)
    v = torch.randn(B, T, n_h, H, V, device=d, dtype=dtype)
    beta = (torch.rand(B, T, n_h, H, device=d) * 2).to(dtype)
    g = F.logsigmoid(torch.randn(B, T, H, device=d) + 3).to(dtype) if gated else None
    return q, k, v, beta, g


def _fla():
    try:
        from fla.ops.gated_delta_product import chunk_gated_delta_product  # type: ignore
        return chunk_gated_delta_product
    except Exception as e:  # noqa: BLE001
        print(f"[delta_throughput] fla not importable ({type(e).__name__}: {e}); "
              "fla rows use peers.md's H200 table as a labelled reference, not this run")
        return None


def time_fn(fn, grad_of=None, do=None):
    from triton.testing import do_bench

    if grad_of is None:
        with torch.no_grad():
            return do_bench(fn, warmup=25, rep=100, return_mode="median")

    def step():
        o = fn()
        torch.autograd.backward(o, do)
        for x in grad_of:
            x.grad = None

    return do_bench(step, warmup=25, rep=100, return_mode="median")


def profile(a, fn):
    from torch.profiler import ProfilerActivity, profile as prof

    for n_h in a.nh:
        for gated in [s == "1" for s in a.gated]:
            q, k, v, beta, g = inputs(a.B, a.T, n_h, a.H, a.K, a.K, gated)
            xs = [x.requires_grad_() for x in (q, k, v, beta, g) if x is not None]
            do = torch.randn_like(q)
            for _ in range(2):
                fn(q, k, v, beta, g, chunk_size=a.chunk, backend="triton")[0].backward(do)
            torch.cuda.synchronize()
            with prof(activities=[ProfilerActivity.CUDA]) as p:
                fn(q, k, v, beta, g, chunk_size=a.chunk, backend="triton")[0].backward(do)
                torch.cuda.synchronize()
            print(f"--- profile n_h={n_h} gated={int(gated)} (one fwd+bwd)")
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nh", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"])
    ap.add_argument("--gated", nargs="+", default=["0", "1"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    ap.add_argument("--profile", action="store_true",
                    help="print per-kernel CUDA times (torch.profiler) of one fwd+bwd per config, then exit")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("[delta_throughput] needs CUDA; nothing timed")
        return
    import triton

    from lrnn_scan.delta import chunk_delta_product

    if a.profile:
        return profile(a, chunk_delta_product)
    fla = _fla()
    dev = torch.cuda.get_device_name()
    B, T, H, K = a.B, a.T, a.H, a.K
    rows = []
    fla_refused = {}            # mode -> reason fla gave (e.g. its Hopper + Triton < 3.7.1 check)
    res = Path(a.results)

    def record(r):
        """Append one row to the results file as soon as it is measured (a run cut short still
        leaves its rows)."""
        new = not res.exists()
        with open(res, "a") as fh:
            if new:
                fh.write("# Benchmark results\n\n")
            if len(rows) == 1:
                fh.write(f"\n## delta_throughput.py — {r['date']} — {dev}, torch {torch.__version__}, "
                         f"Triton {triton.__version__}, B={B} T={T} H={H} K=V={K} bf16, chunk {a.chunk}\n\n")
                fh.write("| n_h | gated | mode | ours (ms) | fla (ms) | fla source | ours/fla |\n"
                         "|---|---|---|---|---|---|---|\n")
            fh.write(f"| {r['n_h']} | {int(r['gated'])} | {r['mode']} | {r['ours_ms']:.3f} | "
                     f"{r['fla_ms'] if r['fla_ms'] else '—'} | {r['fla_source']} | "
                     f"{r['ratio'] if r['ratio'] else '—'} |\n")
    for n_h in a.nh:
        for gated in [s == "1" for s in a.gated]:
            q, k, v, beta, g = inputs(B, T, n_h, H, K, K, gated)
            for mode in a.modes:
                bwd = mode == "fwd+bwd"
                xs = [x.requires_grad_(bwd) for x in (q, k, v, beta, g) if x is not None]
                ours = lambda: chunk_delta_product(q, k, v, beta, g, chunk_size=a.chunk, backend="triton")[0]
                do = torch.randn(B, T, H, K, device="cuda", dtype=q.dtype) if bwd else None
                t_ours = time_fn(ours, xs if bwd else None, do)
                t_fla, src = None, "peers.md H200 (reference, not this run)"
                if fla is not None and mode in fla_refused:
                    src = f"fla refused in this run: {fla_refused[mode]}"
                elif fla is not None:
                    kf = k.flatten(1, 2)
                    vf = v.flatten(1, 2)
                    bf = beta.flatten(1, 2)
                    gf = g if gated else torch.zeros(B, T, H, device="cuda", dtype=q.dtype)
                    f_call = lambda: fla(q=q, k=kf, v=vf, g=gf, beta=bf, num_householder=n_h)[0]
                    try:
                        t_fla, src = time_fn(f_call, xs if bwd else None, do), "fla, same run"
                    except Exception as e:  # noqa: BLE001
                        print(f"[delta_throughput] fla n_h={n_h} gated={gated} {mode} failed: {e}")
                        fla_refused[mode] = str(e).splitlines()[0][:110]
                        src = f"fla refused in this run: {fla_refused[mode]}"
                if t_fla is None:
                    t_fla = PEERS_FLA_H200.get((n_h, gated, mode))
                    if t_fla is not None and not src.startswith("peers.md"):
                        src += "; ratio vs peers.md H200 (reference, not this run)"
                ratio = (t_ours / t_fla) if t_fla else None
                row = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           device=dev, torch=torch.__version__, triton=triton.__version__,
                           B=B, T=T, H=H, K=K, V=K, n_h=n_h, gated=gated, mode=mode, chunk=a.chunk,
                           ours_ms=round(t_ours, 4), fla_ms=t_fla, fla_source=src,
                           ratio=round(ratio, 3) if ratio else None)
                rows.append(row)
                record(row)
                print(f"n_h={n_h} gated={int(gated)} {mode:8s} ours {t_ours:8.3f} ms | fla "
                      f"{t_fla if t_fla else float('nan'):7.3f} ms ({src}) | ratio "
                      f"{ratio if ratio else float('nan'):.3f}", flush=True)
                for x in xs:
                    x.requires_grad_(False)
                torch.cuda.empty_cache()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "delta_throughput.json").write_text(json.dumps(rows, indent=1))
    with open(out / "delta_throughput.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"[delta_throughput] wrote {out}/delta_throughput.csv/json and appended to {res}")


if __name__ == "__main__":
    main()
