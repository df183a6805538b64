"""``lrnn-scan bench`` / ``python -m benchmarks`` / ``python -m lrnn_scan.bench``.

    lrnn-scan bench                       # default grid for this machine (CUDA if present)
    lrnn-scan bench --quick               # a small grid (seconds on CPU)
    lrnn-scan bench --views A,B --ms 1,4,16 --seqlens 512,2048 --modes fwd
    lrnn-scan bench --flops-only          # only the FLOPs-per-step table (Table 5)
    lrnn-scan bench --record              # also append dated rows to benchmarks/RESULTS.md

Outputs go to ``--out`` (default ``./lrnn_scan_bench``): ``bench_<label>_<stamp>.csv/json``,
``flops_table.{csv,md}`` and PNG plots (matplotlib optional). Every file name, printed line and
plot title says ``CPU`` or ``CUDA``; CPU runs use reduced default sizes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

__all__ = ["main", "add_subparser", "build_parser", "add_arguments"]


def _ints(s: str) -> tuple:
    return tuple(int(x) for x in s.split(",") if x.strip())


def _strs(s: str) -> tuple:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda[:i]")
    p.add_argument("--quick", action="store_true", help="a small grid")
    p.add_argument("--views", type=_strs, default=None, help="comma list of A,B,C (default all)")
    p.add_argument("--modes", type=_strs, default=None, help="fwd,fwdbwd (default both)")
    p.add_argument("--ms", type=_ints, default=None, help="block sizes, e.g. 1,2,4,8,16,32")
    p.add_argument("--seqlens", type=_ints, default=None, help="sequence lengths (scan views)")
    p.add_argument("--batch", type=int, default=None, help="batch size (scan views: unless --tokens)")
    p.add_argument("--tokens", type=int, default=None,
                   help="scan views: B = tokens // T per sequence length (CUDA default 16384)")
    p.add_argument("--blocks", type=int, default=None, help="view A: number of blocks (CUDA 128)")
    p.add_argument("--hidden", type=int, default=None, help="view B: hidden size (CUDA 768)")
    p.add_argument("--scan-kinds", type=_strs, default=None, help="bdlru,hlru,bd_materialised")
    p.add_argument("--layers", type=_strs, default=None, dest="layer_kinds",
                   help="view C layers: bdlru,hlru,deltanet,deltaproduct,mamba2,lstm")
    p.add_argument("--layer-ms", type=_ints, default=None, help="view C: m of BD-LRU/H-LRU")
    p.add_argument("--params", type=int, default=None, help="view C target parameters (CUDA 33M)")
    p.add_argument("--n-layers", type=int, default=None)
    p.add_argument("--layer-seqlen", type=int, default=None)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--method", default=None, help="scan method: auto | blelloch | sequential | kernel")
    p.add_argument("--warmup", type=int, default=None,
                   help="CPU: untimed runs; CUDA: do_bench warmup in ms")
    p.add_argument("--rep", type=int, default=None, help="CPU: timed runs; CUDA: do_bench rep in ms")
    p.add_argument("--no-peers", dest="peers", action="store_false", default=None)
    p.add_argument("--no-memory", dest="memory", action="store_false", default=None,
                   help="skip the peak-memory pass")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the layers")
    p.add_argument("--no-plots", dest="plots", action="store_false", default=True)
    p.add_argument("--no-progress", dest="progress", action="store_false", default=True)
    p.add_argument("--flops-only", action="store_true", help="only write the FLOPs table")
    p.add_argument("--flops-hidden", type=int, default=768, help="width of the FLOPs table")
    p.add_argument("--out", default="lrnn_scan_bench", help="output folder")
    p.add_argument("--record", action="store_true",
                   help="append dated rows to the results file (never by default)")
    p.add_argument("--results", default=None,
                   help="results file for --record (default benchmarks/RESULTS.md of the checkout)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")


def build_parser(prog: str = "lrnn-scan bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def add_subparser(subparsers) -> argparse.ArgumentParser:
    """Register ``bench`` on an ``argparse`` sub-parser set; the handler is ``args.func(args)``."""
    p = subparsers.add_parser("bench", help="scan- and layer-level throughput (Fig. 5 views), "
                              "FLOPs table", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run_args)
    return p


def _default_results() -> Path:
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *here.parents]:
        if (base / "benchmarks" / "RESULTS.md").is_file():
            return base / "benchmarks" / "RESULTS.md"
    return Path.cwd() / "benchmarks" / "RESULTS.md"


def run_args(args: argparse.Namespace, argv_for_log: list[str] | None = None) -> int:
    import torch

    from .flops import flops_markdown, flops_table
    from .measure import device_label
    from .report import append_results, stamp, write_outputs, write_plots
    from .runner import run
    from .suite import Config

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    label = device_label(device)
    out = Path(args.out)
    flops_rows = flops_table(args.flops_hidden)
    if args.flops_only:
        out.mkdir(parents=True, exist_ok=True)
        (out / "flops_table.md").write_text(flops_markdown(flops_rows) + "\n")
        print(flops_markdown(flops_rows))
        print(f"wrote {out / 'flops_table.md'}")
        return 0
    fields = {f.name for f in dataclasses.fields(Config)}
    overrides = {k: v for k, v in vars(args).items() if k in fields and k != "device"}
    cfg = Config.for_device(device, quick=args.quick, **overrides)
    if label == "CPU":
        print(f"[CPU] CPU run with reduced sizes (blocks={cfg.blocks}, hidden={cfg.hidden}, "
              f"~{cfg.params:,} parameters, B={cfg.batch}, T={list(cfg.seqlens)}); "
              f"the paper's sizes need CUDA. Numbers below are CPU numbers.")
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "rows_partial.jsonl"
    partial.write_text("")

    def on_row(r: dict) -> None:
        """Print each row and append it to rows_partial.jsonl as soon as it is measured."""
        with open(partial, "a") as fh:
            fh.write(json.dumps(r) + "\n")
        bw = f" {r['gb_per_s']:.3g} GB/s ({r['pct_copy']:.3g}% copy)" if r.get("gb_per_s") else ""
        mem = f" peak {r['peak_mem_mib']:.3g} MiB" if r.get("peak_mem_mib") is not None else ""
        shape = (f"m={r['m']} B={r['B']} T={r['T']} blocks={r['blocks']}" if r["level"] == "scan"
                 else f"m={r['m']} d={r['d_model']} L={r['n_layers']} params={r['params']:,}")
        print(f"[{label}] {r['level']:5s} {r['view']} {r['impl']:>22s} {r['kind']:>15s} {shape} "
              f"{r['mode']:6s} {r['ms']:9.3f} ms {r['tokens_per_s']:12.0f} tok/s{mem}{bw}", flush=True)
    result = run(cfg, progress=args.progress, on_row=on_row)
    tag = f"{label.lower()}_{stamp()}"
    paths = write_outputs(result, flops_rows, out, tag)
    if args.plots:
        for p in write_plots(result, out, tag):
            paths[p.stem] = p
    if args.record:
        res = Path(args.results) if args.results else _default_results()
        cmd = "lrnn-scan bench " + " ".join(argv_for_log if argv_for_log is not None else sys.argv[1:])
        append_results(result, res, cmd.strip())
        print(f"[{label}] appended {len(result['rows'])} rows to {res}")
    print(f"[{label}] wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``main(["--quick"])``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return run_args(args, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
