"""Run-to-run spread of the m = 1 look-back paths: the same configurations timed in interleaved
rounds, with plain ``do_bench`` and with ``do_bench_cudagraph`` (no CPU launch overhead), so a
default chosen from one timing is not a choice made on noise. fp32, B1 T16384 N768 and B8 T2048 N768
(``--set rule``: also B8 T2048 N4096 and B2 T8192 N768).

    python tools/lookback_repeat.py [--rounds 5] [--set default|rule] [--out DIR]
    python tools/lookback_repeat.py --render OUT/lookback_repeat.json --results benchmarks/RESULTS.md

Configurations (``scan.TUNE``): ``off`` (tiled/chunked forward, chunked backward where the rule
chunks), ``lb_fwd`` (look-back forward, tiles of ``lb_chunk``), ``lb_fwd_bwd`` (look-back forward
and backward, fwd+bwd only).
"""
import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.bench.measure import graph_time  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402

FWD = {"off": dict(fwd_lookback=False), "lb_fwd_c32": dict(fwd_lookback=True, lb_chunk=32),
       "lb_fwd_c64": dict(fwd_lookback=True, lb_chunk=64),
       "lb_fwd_c128": dict(fwd_lookback=True, lb_chunk=128)}
FWDBWD = {"off": dict(fwd_lookback=False, bwd_lookback=False),
          "lb_fwd": dict(fwd_lookback=True, bwd_lookback=False),
          "lb_fwd_bwd": dict(fwd_lookback=True, bwd_lookback=True)}
# --set rule: where the look-backs pay, with their defaults (128 x 32 tiles, 4 warps, 4-chunk
# windows since 2026-11-26): "off" = tiled / chunked forward and one-pass / chunked backward,
# "bwd_lb" = that forward with the look-back backward, "lb" = both look-backs; "default" = the
# rule of scan.py. The flagged-word variants of --set words are in commit ff44276 (removed)
RULE_FWD = {"default": {}, "off": dict(fwd_lookback=False), "lb": dict(fwd_lookback=True)}
RULE_FWDBWD = {"default": {}, "off": dict(fwd_lookback=False, bwd_lookback=False),
               "bwd_lb": dict(fwd_lookback=False, bwd_lookback=True),
               "lb": dict(fwd_lookback=True, bwd_lookback=True)}
SHAPES = ((1, 16384, 768), (8, 2048, 768))
RULE_SHAPES = SHAPES + ((8, 2048, 4096), (2, 8192, 768))


def render(path, results):
    """Append the JSON of a run as a Markdown table to ``results``."""
    d = json.loads(Path(path).read_text())
    with open(results, "a") as fh:
        fh.write(f"\n## lookback_repeat.py — {d['date']} — {d['device']}, torch {d['torch']}, Triton "
                 f"{d['triton']}; fp32 m = 1, {d['rounds']} interleaved rounds, ms per round: "
                 "median [min, max]; 'graph' = do_bench_cudagraph\n\n"
                 "| mode | B | T | N | config | do_bench ms | graph ms |\n|---|---|---|---|---|---|---|\n")
        for r in d["rows"]:
            cells = []
            for k in ("plain", "graph"):
                v = r.get(k) or []
                cells.append(f"{statistics.median(v):.4f} [{min(v):.4f}, {max(v):.4f}]" if v else "—")
            fh.write(f"| {r['mode']} | {r['B']} | {r['T']} | {r['N']} | {r['config']} | {cells[0]} | "
                     f"{cells[1]} |\n")


def _timed(fn, graph):
    if graph:
        return graph_time(fn, rep=20)
    return triton.testing.do_bench(fn, warmup=5, rep=20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--render", default=None, help="a JSON of this tool to append to --results")
    ap.add_argument("--results", default="benchmarks/RESULTS.md")
    ap.add_argument("--set", default="default", choices=("default", "rule"))
    a = ap.parse_args()
    if a.render:
        return render(a.render, a.results)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    meta = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, rounds=a.rounds)
    rows = {}
    for rnd in range(a.rounds):
        for B, T, N in (SHAPES if a.set == "default" else RULE_SHAPES):
            g = torch.Generator(device="cuda").manual_seed(rnd)
            x = torch.rand(B, T, N, device="cuda", generator=g) * 0.5 + 0.45
            b = torch.randn(B, T, N, device="cuda", generator=g)
            dh = torch.randn_like(b)
            xg, bg = x.clone().requires_grad_(), b.clone().requires_grad_()
            sets = (FWD, FWDBWD) if a.set == "default" else (RULE_FWD, RULE_FWDBWD)
            for mode, configs in zip(("fwd", "fwd+bwd"), sets):
                for name, tune in configs.items():
                    if mode == "fwd":
                        fn = lambda: S.diagonal_scan(x, b)  # noqa: E731
                    else:
                        fn = lambda: torch.autograd.grad(S.diagonal_scan(xg, bg)[0], (xg, bg), dh)  # noqa: E731
                    row = rows.setdefault((mode, B, T, N, name), dict(
                        mode=mode, B=B, T=T, N=N, config=name, tune=tune, plain=[], graph=[]))
                    try:
                        with S.tuned(tune):
                            for graph in (False, True):
                                ms = _timed(fn, graph)
                                row["graph" if graph else "plain"].append(round(ms, 4))
                    except Exception as e:  # keep the other rows (a capture may fail)
                        print(f"{mode} B{B} T{T} N{N} {name}: {e!r}"[:200], flush=True)
                    print(f"round {rnd} {mode:7s} B{B} T{T} N{N} {name:12s} plain {row['plain'][-1:]} "
                          f"graph {row['graph'][-1:]}", flush=True)
            # after every shape: a run cut short keeps what it measured
            (Path(a.out) / "lookback_repeat.json").write_text(
                json.dumps(dict(meta, rows=list(rows.values())), indent=1))


if __name__ == "__main__":
    main()
