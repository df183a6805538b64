"""Forward+backward of the block-diagonal scan at B8 T2048 N768 (and B1 T16384 N768) under the
chunking choices of ``scan.TUNE`` (``--set chunk``: the default rule, no chunking, other chunk
targets / lengths) or the backward kernels (``--set bwd``: g4, ring2, ring4, v1 under the default
chunk rule): finds the rule behind the slow fwd+bwd rows of scan_throughput.py at N768. fp32,
do_bench medians; ``--graph`` also times CUDA-graph replays (``do_bench_cudagraph``: no host
launch overhead), so a row that is host-bound shows as a large plain/graph ratio.

    python tools/fwdbwd_chunk_sweep.py [--set chunk|bwd] [--m 1 2 4] [--graph] [--shapes 8x2048x768] [--out DIR]
    python tools/fwdbwd_chunk_sweep.py --render OUT/fwdbwd_chunk_sweep.json --results benchmarks/RESULTS.md
"""
import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.bench.measure import graph_time  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402

CHOICES = {"default": {}, "no_chunk": {"chunk": 0}, "target1": {"chunk_target": 1},
           "target2": {"chunk_target": 2}, "target8": {"chunk_target": 8}, "chunk256": {"chunk": 256},
           "chunk512": {"chunk": 512}, "chunk1024": {"chunk": 1024}}
BWD_CHOICES = {"default": {}, "bwd_g4": {"bwd_variant": "g4"}, "bwd_ring2": {"bwd_variant": "ring2"},
               "bwd_ring4": {"bwd_variant": "ring4"}, "bwd_v1": {"bwd_variant": "v1"}}


def render(path, results):
    """Append the sweep's JSON as a Markdown table to ``results``."""
    d = json.loads(Path(path).read_text())
    with open(results, "a") as fh:
        fh.write(f"\n## fwdbwd_chunk_sweep.py — {d.get('date', '?')} — {d['device']}, torch {d['torch']}, "
                 f"Triton {d['triton']}; fp32, block_diagonal_scan forward+backward under scan.TUNE "
                 f"overrides ({d.get('set', 'chunk')} set); TB/s = byte floor (A, b, dh read, h, dA, db "
                 "written) / median; graph = do_bench_cudagraph median (no host launch overhead)\n\n"
                 "| B | T | N | m | choice | TUNE | ms | TB/s | vs default | graph ms |\n"
                 "|---|---|---|---|---|---|---|---|---|---|\n")
        for r in d["rows"]:
            graph = f"{r['graph_ms']:.4f}" if r.get("graph_ms") is not None else "—"
            fh.write(f"| {r['B']} | {r['T']} | {r['N']} | {r['m']} | {r['choice']} | "
                     f"{json.dumps(r['tune']) if r['tune'] else '—'} | {r['ms']:.4f} | {r['tbps']:.3f} | "
                     f"{r['vs_default']:.3f} | {graph} |\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--render", default=None, help="a sweep JSON to append to --results, no GPU run")
    ap.add_argument("--results", default="benchmarks/RESULTS.md")
    ap.add_argument("--set", default="chunk", choices=("chunk", "bwd"))
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--graph", action="store_true", help="also time CUDA-graph replays")
    ap.add_argument("--shapes", nargs="+", default=["8x2048x768", "1x16384x768"], help="BxTxN")
    a = ap.parse_args()
    if a.render:
        return render(a.render, a.results)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for B, T, N in (tuple(int(x) for x in sh.split("x")) for sh in a.shapes):
        for m in a.m:
            H = N // m
            A = torch.randn(B, T, H, m, m, device="cuda") * (0.9 / m ** 0.5)
            b = torch.randn(B, T, H, m, device="cuda")
            g = torch.randn_like(b)
            A.requires_grad_(), b.requires_grad_()
            floor = (2 * A.numel() + 4 * b.numel()) * 4  # A, b, dh read; h read; dA, db written
            base = None
            for name, tune in (CHOICES if a.set == "chunk" else BWD_CHOICES).items():
                try:
                    with S.tuned(tune):
                        f = lambda: torch.autograd.grad(S.block_diagonal_scan(A, b)[0], (A, b), g)  # noqa: E731
                        ms = triton.testing.do_bench(f, warmup=10, rep=40)
                        gms = graph_time(f, rep=40) if a.graph else None
                except Exception as e:  # keep the other rows
                    print(f"B{B} T{T} N{N} m{m} {name}: {e!r}"[:200], flush=True)
                    continue
                base = base or ms
                row = dict(B=B, T=T, N=N, m=m, choice=name, tune=tune, ms=round(ms, 4),
                           tbps=round(floor / ms / 1e9, 3), vs_default=round(ms / base, 3),
                           graph_ms=None if gms is None else round(gms, 4))
                rows.append(row)
                print(f"B{B} T{T} N{N} m{m:2d} {name:10s} {ms:8.4f} ms {row['tbps']:6.3f} TB/s "
                      f"x{row['vs_default']:.3f} graph {row['graph_ms']}", flush=True)
                # written after every row: a run cut short keeps what it measured
                (Path(a.out) / "fwdbwd_chunk_sweep.json").write_text(json.dumps(
                    dict(date=date, set=a.set, device=torch.cuda.get_device_name(), torch=torch.__version__,
                         triton=triton.__version__, rows=rows), indent=1))
            del A, b, g
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
