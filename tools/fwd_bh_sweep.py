"""Forward block-group sweep of the materialised-A block-diagonal scan (issue 3's small shapes).

At B8 T2048 N768 the default block group (``BH = 128 / MP²`` blocks per program, one 16-byte
vector of ``A`` per thread) gives 96 programs of one warp at m = 2 (fewer than the H100's 132
SMs) and 192 at m = 4. Smaller groups give more programs with narrower loads. This times each
``TUNE`` setting with plain ``do_bench`` and with CUDA-graph replays (GPU time only), checks its
output against the default's (max relative difference; the arithmetic per block is the same, so
it should be ~0), and times a device copy of the same byte count (the roofline of a problem this
small, launch and tail included).

    python tools/fwd_bh_sweep.py [--m 2 4 8] [--shapes 8x2048x768 1x16384x768] [--out DIR]
    python tools/fwd_bh_sweep.py --h0 [--m 2 4 8] [--out DIR]   # every row with an initial state
    python tools/fwd_bh_sweep.py --render DIR/fwd_bh_sweep.json --results benchmarks/RESULTS.md

Each row also counts NaN / inf in the output and the reference (``nan_out_ref_inf_out_refmax``),
and the inputs are checked (row sums of ``A`` = 0.99) before the first scan of a shape: on
2026-11-25 this sweep's ``A`` at ``m = 8`` was corrupted by Triton's ``do_bench_cudagraph``
running the copy timing on a side stream while the kernels making ``A`` were still queued on the
default stream; ``graph_time`` synchronises first
(kernels/block_diagonal/README.md, "The NaN at B1 T16384 N768, m = 8").
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from lrnn_scan.bench.inputs import stable_blocks
from lrnn_scan.bench.measure import graph_copy, graph_time
from lrnn_scan.kernels.block_diagonal import scan as S


def _configs(m, T):
    mp = triton.next_power_of_2(m)
    base = max(1, 128 // (mp * mp))
    half = base // 2 if (base // 2) * mp * mp >= 32 else None   # >= one element per lane
    out = {"default": {}}
    if T <= 4096:                                    # one pass
        for bh in (base // 2, base // 4):
            if bh >= 1 and bh * mp * mp >= 32:
                for var in ("ring8", "ring4"):
                    out[f"bh{bh}_{var}"] = dict(bh=bh, num_warps=1, variant=var)
    else:                                            # chunked forward (few programs)
        if half:
            out[f"bh{half}"] = dict(bh=half, num_warps=1)
        for cl in (512, 1024):
            out[f"chunk{cl}"] = dict(chunk_len=cl)
        if half:
            out[f"chunk512_bh{half}"] = dict(chunk_len=512, bh=half, num_warps=1)
    return out


def render(path, results, note=""):
    """Append a sweep JSON's rows to a RESULTS markdown file (no GPU needed)."""
    d = json.loads(Path(path).read_text())
    with open(results, "a") as f:
        f.write(f"\n## tools/fwd_bh_sweep.py, {d['date']}\n\n{d['device']}, torch {d['torch']}, Triton "
                f"{d['triton']}; copy {d['copy_tbs']} TB/s (1 GiB); fp32, forward only. graph = "
                f"CUDA-graph replays (graph_time, median); same-size copy = a device copy of the scan's bytes (A, b read, "
                f"h written), CUDA graph; rel. diff = against the default's output. {note}\n\n"
                "| B | T | N | m | config | TUNE | ms | graph ms | % copy (graph) | same-size copy ms | "
                "% of same-size copy | rel. diff |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in d["rows"]:
            f.write(f"| {r['B']} | {r['T']} | {r['N']} | {r['m']} | {r['config']} | {r['tune'] or '—'} | "
                    f"{r['ms']} | {r['graph_ms']} | {r['pct_of_copy_bw']} | {r['same_size_copy_ms']} | "
                    f"{r['pct_of_same_size_copy']} | {r['rel_diff']:.1e} |\n")
    print(f"appended {len(d['rows'])} rows to {results}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", default=None, help="a sweep JSON to append to --results (no GPU)")
    ap.add_argument("--results", default="benchmarks/RESULTS.md")
    ap.add_argument("--note", default="")
    ap.add_argument("--m", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--shapes", nargs="+", default=["8x2048x768", "1x16384x768"], help="BxTxN")
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--h0", action="store_true", help="every row with a random initial state")
    a = ap.parse_args()
    if a.render:
        return render(a.render, a.results, a.note)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    meta = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    x = torch.empty(1 << 28, device="cuda")
    y = torch.empty_like(x)
    bw = 2 * x.numel() * 4 / do_bench(lambda: y.copy_(x)) / 1e9       # TB/s, 1 GiB copy
    meta["copy_tbs"] = round(bw, 3)
    print(json.dumps(meta), flush=True)
    del x, y
    rows = []
    for B, T, N in (tuple(int(x) for x in s.split("x")) for s in a.shapes):
        for m in a.m:
            H = N // m
            A = stable_blocks(B, T, H, m, m, device="cuda")
            b = torch.randn(B, T, H, m, device="cuda")
            nbytes = (A.numel() + 2 * b.numel()) * 4
            src = torch.empty(nbytes // 8, device="cuda")
            dst = torch.empty_like(src)
            cp = graph_time(graph_copy(src, dst), rep=40)
            init = torch.randn(B, H, m, device="cuda") if a.h0 else None
            dev = float((A.sum(-1) - 0.99).abs().max())
            if dev > 1e-5:
                raise RuntimeError(f"A is not what it was made as: max |row sum - 0.99| = {dev}")
            ref = S.block_diagonal_scan(A, b, init)[0]
            for name, tune in _configs(m, T).items():
                try:
                    with S.tuned(tune):
                        f = lambda: S.block_diagonal_scan(A, b, init)  # noqa: E731
                        h = f()[0]
                        err = ((h - ref).norm() / ref.norm()).item()
                        nans = (int(torch.isnan(h).sum()), int(torch.isnan(ref).sum()),
                                int(torch.isinf(h).sum()), float(ref.abs().max()))
                        ms = do_bench(f, warmup=10, rep=40)
                        gms = graph_time(f, rep=40)
                except Exception as e:  # keep the other rows
                    print(f"B{B} T{T} N{N} m{m} {name}: {e!r}"[:300], flush=True)
                    continue
                row = dict(B=B, T=T, N=N, m=m, h0=a.h0, config=name, tune=tune, ms=round(ms, 4),
                           graph_ms=round(gms, 4), same_size_copy_ms=round(cp, 4),
                           pct_of_copy_bw=round(100 * nbytes / gms / 1e9 / bw, 1),
                           pct_of_same_size_copy=round(100 * cp / gms, 1), rel_diff=err,
                           nan_out_ref_inf_out_refmax=nans)
                rows.append(row)
                print(json.dumps(row), flush=True)
                (Path(a.out) / "fwd_bh_sweep.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
            del A, b, init, ref, src, dst
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
