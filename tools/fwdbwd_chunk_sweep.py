"""Forward+backward of the block-diagonal scan at B8 T2048 N768 (and B1 T16384 N768) under the
chunking choices of ``scan.TUNE`` (``--set chunk``: the default rule, no chunking, other chunk
targets / lengths), the backward kernels (``--set bwd``: g4, ring2, ring4, v1 under the default
chunk rule) or the chunk summaries (``--set summary``: ring vs the tensor-core ``summary.py`` at
forced chunk lengths), the m = 1 look-back forward (``--set lb1``) or the m = 1 tiles where
they give few programs (``--set few``); ``--fwd`` times the forward alone): finds the rule behind the slow rows of
scan_throughput.py at N768 and B1 T16384. ``err``: relative RMS against the first choice. fp32,
do_bench medians; ``--graph`` also times CUDA-graph replays (``do_bench_cudagraph``: no host
launch overhead), so a row that is host-bound shows as a large plain/graph ratio. ``--profile``
adds each row's kernels (torch.profiler: calls and microseconds per call of the pass).

    python tools/fwdbwd_chunk_sweep.py [--set chunk|bwd|summary|lb1|few] [--fwd] [--m 1 2 4] [--graph] [--shapes 8x2048x768] [--profile] [--out DIR]
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
from lrnn_scan.bench.measure import copy_bandwidth, graph_copy, graph_time, kernel_times  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402

# the non-default rows keep bd_lookback off: with --fwd they time the chunked forward, not the
# default look-back (m >= 16)
CHOICES = {"default": {}, **{name: dict(tune, bd_lookback=False) for name, tune in (
    ("no_chunk", {"chunk": 0}), ("target1", {"chunk_target": 1}), ("target2", {"chunk_target": 2}),
    ("target8", {"chunk_target": 8}), ("chunk256", {"chunk": 256}), ("chunk512", {"chunk": 512}),
    ("chunk1024", {"chunk": 1024}))}}
# chunk summaries (summary.py): tensor-core products vs the ring summary, forced 256/512-step chunks
# chunked rows keep bd_lookback off (the default look-back takes forwards from m = 16 on)
SUMMARY_CHOICES = {"default": {}, "chunked": {"bd_lookback": False},
                   "ring256": {"summary": "ring", "chunk": 256, "bd_lookback": False},
                   "dot256": {"summary": "dot", "chunk": 256, "bd_lookback": False},
                   "dot512": {"summary": "dot", "chunk": 512, "bd_lookback": False},
                   "dot256_nt2": {"summary": "dot", "chunk": 256, "bd_lookback": False, "sum_nt": 2},
                   "dot256_ieee": {"summary": "dot", "chunk": 256, "bd_lookback": False, "sum_prec": "ieee"},
                   "dot256_tf32": {"summary": "dot", "chunk": 256, "bd_lookback": False, "sum_prec": "tf32"},
                   # single-pass look-back (lookback_dot.py; forward without gradients only: with
                   # gradients these rows are the default chunked path again)
                   "lookback64": {"bd_lookback": True, "bdlb_chunk": 64},
                   "lookback128": {"bd_lookback": True, "bdlb_chunk": 128},
                   "lookback32": {"bd_lookback": True, "bdlb_chunk": 32},
                   "lookback64_always": {"bd_lookback": "always", "bdlb_chunk": 64},  # unchunked shapes too
                   # deeper software pipelines of the summary loop (sum_ns: its loads in flight)
                   "dot256_ns4": {"summary": "dot", "chunk": 256, "bd_lookback": False, "sum_ns": 4},
                   "dot256_ns6": {"summary": "dot", "chunk": 256, "bd_lookback": False, "sum_ns": 6},
                   "dot256_ns8": {"summary": "dot", "chunk": 256, "bd_lookback": False, "sum_ns": 8},
                   "dot256_ns12": {"summary": "dot", "chunk": 256, "bd_lookback": False, "sum_ns": 12},
                   "lookback64_ns3": {"bd_lookback": True, "bdlb_chunk": 64, "sum_ns": 3},
                   "lookback64_ns8": {"bd_lookback": True, "bdlb_chunk": 64, "sum_ns": 8},
                   "lookback128_ns8": {"bd_lookback": True, "bdlb_chunk": 128, "sum_ns": 8},
                   # shorter chunks: less of A in flight between a chunk's two reads (L2 reuse?)
                   "lookback16": {"bd_lookback": True, "bdlb_chunk": 16},
                   # one block's (P, E) per thread (summary_thread.py, m <= 8) at forced chunk lengths
                   **{f"thread{c}": {"summary": "thread", "chunk": c, "bd_lookback": False}
                      for c in (64, 128, 256, 512)},
                   "thread128_nw2": {"summary": "thread", "chunk": 128, "bd_lookback": False, "sumt_nw": 2},
                   "ring128": {"summary": "ring", "chunk": 128, "bd_lookback": False},
                   "dot128": {"summary": "dot", "chunk": 128, "bd_lookback": False}}
# m = 1 forward: the tiled one-pass kernel against the look-back (lookback.py) with its defaults
# (128 x 32 tiles, 4 warps, 4-chunk windows), the defaults before 2026-11-26 (8 warps, 16-chunk
# windows) and 64-step tiles. The persistent and flagged-word variants of the sixteenth session
# are in commit ff44276 (slower on an H100, removed)
LB1_CHOICES = {"default": {}, "tiles": {"fwd_lookback": False}, "lb": {"fwd_lookback": True},
               "lb_nw8_w16": {"fwd_lookback": True, "lb_nw": 8, "lb_window": 16},
               "lb64": {"fwd_lookback": True, "lb_chunk": 64},
               # B8 T2048 N768 leads, timed in the seventeenth session on an H200 (slower, RESULTS.md)
               "lb_bn16": {"fwd_lookback": True, "lb_bn": 16}, "lb_nw2": {"fwd_lookback": True, "lb_nw": 2},
               "lb_c256_nw8": {"fwd_lookback": True, "lb_chunk": 256, "lb_nw": 8}}
# m = 1 tiles where the default tiles give few programs (scan._DIAG_FEW; (64, 32, 2) at B8 T2048
# N768 was 192 two-warp programs, 1.45 per SM): more, smaller programs per SM; forwards (--fwd) that
# ptxas compiles for sm_90a without spills (64 x 32 on 1 warp and 128 x 32 on 4 spill). Timed in
# the seventeenth session (RESULTS.md): 128 x 16 on 2 warps became the default. The keys set the
# backward's few-program tiles too (its own: bt_bwd, ...)
FEW_CHOICES = {"default": {}, **{f"few_{bt}x{bn}_nw{nw}": {"bt_few": bt, "bn_few": bn, "nw_few": nw}
                                 for bt, bn, nw in ((32, 32, 1), (64, 16, 1), (32, 16, 1), (16, 32, 1),
                                                    (128, 16, 2), (32, 32, 2), (16, 64, 2),
                                                    # seventeenth session: around 128 x 16 (H200: 0.0455 ms
                                                    # graph against the default's 0.056)
                                                    (64, 16, 2), (256, 8, 2), (128, 8, 1), (128, 16, 4),
                                                    (64, 32, 2))}}  # the default before the seventeenth
BWD_CHOICES = {"default": {}, "bwd_g4": {"bwd_variant": "g4"}, "bwd_ring2": {"bwd_variant": "ring2"},
               "bwd_ring4": {"bwd_variant": "ring4"}, "bwd_v1": {"bwd_variant": "v1"},
               # the one-step backward with deeper software pipelines (Triton 3.6 turns its loads into
               # cp.async copies to shared memory NS - 1 steps ahead); H200, seventeenth session: B8
               # T2048 N768 fwd+bwd m = 4 / 8 / 16 0.401 / 0.519 / 0.868 ms at NS 16 against the
               # default ring4's 0.477 / 0.569 / 0.894 (m = 2 slower: 0.321 against 0.277)
               **{f"bwd_v1_ns{ns}": {"bwd_variant": "v1", "num_stages": ns} for ns in (8, 12, 16, 24, 32)}}


def render(path, results):
    """Append the sweep's JSON as a Markdown table to ``results``."""
    d = json.loads(Path(path).read_text())
    with open(results, "a") as fh:
        fh.write(f"\n## fwdbwd_chunk_sweep.py — {d.get('date', '?')} — {d['device']}, torch {d['torch']}, "
                 f"Triton {d['triton']}; copy {d.get('copy_tbps', '?')} TB/s; fp32, block_diagonal_scan "
                 "(pass: forward alone or forward+backward) "
                 f"under scan.TUNE overrides ({d.get('set', 'chunk')} set); TB/s = byte floor (fwd: A, b "
                 "read, h written; fwd+bwd: A, b, dh read, h read, dA, db written) / median; graph = "
                 "do_bench_cudagraph median (no host launch overhead)\n\n"
                 "| B | T | N | m | pass | choice | TUNE | ms | TB/s | % copy | vs default | graph ms | err |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in d["rows"]:
            graph = f"{r['graph_ms']:.4f}" if r.get("graph_ms") is not None else "—"
            err = f"{r['err']:.1e}" if r.get("err") is not None else "—"
            kind = "fwd" if r.get("fwd_only") else "fwd+bwd"
            fh.write(f"| {r['B']} | {r['T']} | {r['N']} | {r['m']} | {kind} | {r['choice']} | "
                     f"{json.dumps(r['tune']) if r['tune'] else '—'} | {r['ms']:.4f} | {r['tbps']:.3f} | "
                     f"{r.get('pct_copy', '—')} | "
                     f"{r['vs_default']:.3f} | {graph} | {err} |\n")
        prof = [r for r in d["rows"] if r.get("kernels")]
        if prof:
            fh.write("\nKernels of each row (torch.profiler; calls and microseconds per call of the pass):\n\n"
                     "| B | T | N | m | pass | choice | kernel | calls | µs |\n|---|---|---|---|---|---|---|---|---|\n")
            for r in prof:
                kind = "fwd" if r.get("fwd_only") else "fwd+bwd"
                for k, (c, us) in r["kernels"].items():
                    fh.write(f"| {r['B']} | {r['T']} | {r['N']} | {r['m']} | {kind} | {r['choice']} | "
                             f"`{k}` | {c:g} | {us:.1f} |\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--render", default=None, help="a sweep JSON to append to --results, no GPU run")
    ap.add_argument("--results", default="benchmarks/RESULTS.md")
    ap.add_argument("--set", default="chunk", choices=("chunk", "bwd", "summary", "lb1", "few"))
    ap.add_argument("--fwd", action="store_true", help="time the forward alone (no autograd graph)")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--graph", action="store_true", help="also time CUDA-graph replays")
    ap.add_argument("--shapes", nargs="+", default=["8x2048x768", "1x16384x768"], help="BxTxN")
    ap.add_argument("--choices", nargs="+", default=None, help="only these choices of the set")
    ap.add_argument("--profile", action="store_true", help="also record each row's kernel times")
    a = ap.parse_args()
    if a.render:
        return render(a.render, a.results)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    Path(a.out).mkdir(parents=True, exist_ok=True)
    stem = "fwdbwd_chunk_sweep" if a.set == "chunk" and not a.fwd else \
        f"fwdbwd_chunk_sweep_{a.set}{'_fwd' if a.fwd else ''}"
    # a second sweep of the same set in one output directory gets its own file (the seventeenth
    # session lost one sweep's rows to the next one's file)
    out_path, k = Path(a.out) / f"{stem}.json", 1
    while out_path.exists():
        out_path, k = Path(a.out) / f"{stem}_{k}.json", k + 1
    copy = copy_bandwidth(torch.device("cuda")) / 1e3  # GB/s -> TB/s, same run
    print(f"copy bandwidth {copy:.3f} TB/s", flush=True)
    for B, T, N in (tuple(int(x) for x in sh.split("x")) for sh in a.shapes):
        for m in a.m:
            H = N // m
            A = torch.randn(B, T, H, m, m, device="cuda") * (0.9 / m ** 0.5)
            b = torch.randn(B, T, H, m, device="cuda")
            g = torch.randn_like(b)
            A.requires_grad_(), b.requires_grad_()
            # fwd+bwd: A, b, dh read; h read; dA, db written. fwd: A, b read, h written
            floor = ((A.numel() + 2 * b.numel()) if a.fwd else (2 * A.numel() + 4 * b.numel())) * 4
            base = ref = None
            same = None
            if a.graph:  # a copy moving the same bytes (half read, half written): small-size roofline
                src = torch.empty(floor // 8, device="cuda")
                dst = torch.empty_like(src)
                same = floor / graph_time(graph_copy(src, dst), rep=40) / 1e9
                del src, dst
                print(f"B{B} T{T} N{N} m{m}: same-size copy {same:.3f} TB/s ({100 * same / copy:.1f} % "
                      f"of the 1 GiB copy)", flush=True)
            choices = {"chunk": CHOICES, "bwd": BWD_CHOICES, "summary": SUMMARY_CHOICES,
                       "lb1": LB1_CHOICES, "few": FEW_CHOICES}[a.set]
            for name, tune in choices.items():
                if a.choices and name not in a.choices:
                    continue
                try:
                    with S.tuned(tune):
                        if a.fwd:
                            def f():
                                with torch.no_grad():
                                    return S.block_diagonal_scan(A, b)[0]
                        else:
                            def f():
                                return torch.autograd.grad(S.block_diagonal_scan(A, b)[0], (A, b), g)
                        out = f()
                        out = out if a.fwd else torch.cat([o.flatten() for o in out])
                        ref = out.double() if ref is None else ref  # relative RMS vs the first choice
                        err = ((out.double() - ref).norm() / ref.norm()).item()
                        del out
                        if base is None:
                            # the first choice of a shape timed 2-5x slow in its first do_bench
                            # (2026-11-26, H100: B1 T16384 m = 2 fwd+bwd 3.26 ms against 0.68 in
                            # scan_throughput.py): one discarded round first
                            triton.testing.do_bench(f, warmup=10, rep=40)
                        ms = triton.testing.do_bench(f, warmup=10, rep=40)
                        gms = graph_time(f, rep=40) if a.graph else None
                        kt = kernel_times(f, "cuda") if a.profile else {}
                except Exception as e:  # keep the other rows
                    print(f"B{B} T{T} N{N} m{m} {name}: {e!r}"[:200], flush=True)
                    continue
                base = base or ms
                row = dict(B=B, T=T, N=N, m=m, choice=name, tune=tune, ms=round(ms, 4), err=err,
                           pct_copy=round(100 * floor / ms / 1e9 / copy, 1),
                           fwd_only=a.fwd,
                           tbps=round(floor / ms / 1e9, 3), vs_default=round(ms / base, 3),
                           graph_ms=None if gms is None else round(gms, 4),
                           same_copy_tbps=None if same is None else round(same, 3))
                if kt:
                    row["kernels"] = {k[:90]: [round(c, 2), round(us, 1)] for k, (c, us) in list(kt.items())[:8]}
                rows.append(row)
                print(f"B{B} T{T} N{N} m{m:2d} {name:10s} {ms:8.4f} ms {row['tbps']:6.3f} TB/s "
                      f"{row['pct_copy']:5.1f} % x{row['vs_default']:.3f} graph {row['graph_ms']} "
                      f"err {err:.2e}", flush=True)
                for k, (c, us) in row.get("kernels", {}).items():
                    print(f"    {us:9.1f} us  x{c:<5g} {k}", flush=True)
                # written after every row: a run cut short keeps what it measured
                out_path.write_text(json.dumps(
                    dict(date=date, set=a.set, copy_tbps=round(copy, 3), device=torch.cuda.get_device_name(),
                         torch=torch.__version__,
                         triton=triton.__version__, rows=rows), indent=1))
            del A, b, g, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
