"""The m = 2 look-back forward (``kernels/block_diagonal/lookback2.py``) on a GPU against the forward
without it (``ring``: ring kernels, chunked where the rule chunks) and the default (``TUNE``
empty). First correctness against a float64 loop on the GPU (outputs and final states,
NaN-poisoned buffers, varlen, windows of 1, inclusive states withheld so that look-backs walk to
chunk 0, each case 5 times to catch races), then CUDA-graph medians in interleaved rounds at the
``SHAPES`` (fp32), with a copy of the same bytes in the same run.

    python tools/lb2_compare.py [--rounds 3] [--out DIR] [--no-check] [--bwd] [--shapes 8x2048x768 ...]
    python tools/lb2_compare.py --render OUT/lb2_compare.json --results benchmarks/RESULTS.md
"""
import argparse
import os
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.bench.measure import graph_copy, graph_time  # noqa: E402
from lrnn_scan.kernels.block_diagonal import ref, scan as S  # noqa: E402
from lrnn_scan.kernels.block_diagonal.lookback2 import bd2_lookback_forward  # noqa: E402

SHAPES = [(8, 2048, 768), (1, 16384, 768), (2, 8192, 768), (4, 4096, 768), (16, 1024, 768),
          (8, 2048, 1536), (8, 2048, 4096)]
CONFIGS = {f"lb2_c{c}_w{w}": dict(lb2_chunk=c, lb2_window=w) for c in (16, 32) for w in (2, 4)}


def _inputs(B, T, H, dtype, seed=0, m=2):
    """Row-stochastic m x m blocks times 0.99 (products stay bounded), Gaussian ``b``, on the GPU
    (also ``lb4_compare.py``'s, with ``m = 4``)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.rand(B, T, H, m, m, device="cuda", generator=g) + 0.05
    A = A / A.sum(-1, keepdim=True) * 0.99
    b = torch.randn(B, T, H, m, device="cuda", generator=g)
    torch.cuda.synchronize()
    return A.to(dtype), b.to(dtype)


def _ref(A, b, h0, cu):
    """The float64 reference (``ref.block_diagonal_scan_ref``, on the GPU): ``(h, h_final)``."""
    return ref.block_diagonal_scan_ref(A.double(), b.double(), None if h0 is None else h0.double(), True, cu)


def _ring(A, b):
    """The forward without lookback2 (ring kernels, chunked where the rule chunks)."""
    with S.tuned(dict(bd2_lookback=False, bd2_tma=False)):
        return S.block_diagonal_scan(A, b)


def _rel(x, y):
    return ((x.double() - y).norm() / y.norm()).item()


def timed_rounds(fns, nbytes, rounds, device="cuda", timer=None):
    """CUDA-graph medians (ms) of ``fns`` in ``rounds`` interleaved rounds, with a first column
    ``copy``: a device copy moving ``nbytes`` (read + written) in the same rounds (also
    ``lb4_compare.py``'s and ``tune_compare.py``'s). ``timer(fn) -> ms`` replaces ``graph_time``
    (e.g. eager ``do_bench``, where host launch gaps count)."""
    timer = timer or graph_time
    src = torch.empty(nbytes // 8, device=device)
    dst = torch.empty_like(src)
    fns = {"copy": graph_copy(src, dst), **fns}  # an SM kernel: graph-timed copy_ can be a DMA
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(timer(fn))
    return {k: statistics.median(v) for k, v in times.items()}


def check():
    """Returns the number of failed cases; prints one line per case. Every buffer the launcher
    allocates starts as NaN (``LRNN_SCAN_POISON``, read by ``scan._empty``), so an unwritten
    element fails."""
    os.environ["LRNN_SCAN_POISON"] = "1"
    try:
        return _check()
    finally:
        os.environ.pop("LRNN_SCAN_POISON")


def _check():
    fails = 0
    cases = [((2, 1037, 100), None, dict()), ((1, 3001, 384), None, dict(lb2_window=1)),
             ((1, 1000, 64), [0, 1, 1, 63, 65, 400, 1000], dict(lb2_chunk=16)),
             ((1, 2000, 200), [0, 700, 701, 2000], dict(lb_publish_incl=False)),
             ((1, 5003, 768 // 2), [0, 1000, 1001, 3333, 5003], dict(lb2_chunk=32, lb2_window=8)),
             ((8, 2048, 384), None, dict(lb2_chunk=16, lb2_bh=64)),
             ((1, 2000, 200), [0, 700, 701, 2000], dict(lb_publish_incl=False, lb2_window=2))]
    for (B, T, H), cu, tune in cases:
        A, b = _inputs(B, T, H, torch.float32, seed=T)
        cut = None if cu is None else torch.tensor(cu, device="cuda")
        nseq = B if cu is None else len(cu) - 1
        h0 = torch.randn(nseq, H, 2, device="cuda")
        hr, fr = _ref(A, b, h0, cut)
        worst = 0.0
        for rep in range(5):  # races show as run-to-run differences
            h, fin, _ = bd2_lookback_forward(A, b, h0, cut, tune, S._empty)
            worst = max(worst, _rel(h, hr), _rel(fin, fr), float(torch.isnan(h).any()))
        ok = worst < 1e-5
        fails += not ok
        print(f"check B{B} T{T} H{H} cu={cu} {tune}: worst rel {worst:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    A, b = _inputs(2, 1037, 100, torch.bfloat16)
    h, fin, _ = bd2_lookback_forward(A, b, None, None, {}, S._empty)
    hr, fr = _ref(A, b, None, None)
    e = max(_rel(h, hr), _rel(fin, fr))
    fails += not e < 5e-3
    print(f"check bf16 B2 T1037 H100: rel {e:.2e} {'ok' if e < 5e-3 else 'FAIL'}", flush=True)
    return fails


def bwd_rows(rounds, shapes):
    """fwd+bwd (``torch.autograd.grad`` of ``h`` against a random ``dh``) at ``shapes``: the
    default, the look-back backward forced (``lb2_bwd``: ``TUNE['bd2_bwd_lookback'] = True``) and
    off (``no_lb2_bwd``: the ring or chunked backward, the forward as without gradients), the
    passes without either look-back (``ring``), and a copy of the byte floor (A, b, dh, h read;
    dA, db written). Returns ``(rows, failures)``: the look-back's gradients against
    ``no_lb2_bwd``'s (the fp64 checks are the GPU tests')."""
    rows, fails = {}, 0
    for B, T, N in shapes:
        A, b = _inputs(B, T, N // 2, torch.float32)
        A.requires_grad_()
        b.requires_grad_()
        dh = torch.randn_like(b)

        def fb(tune):
            with S.tuned(tune):
                return torch.autograd.grad(S.block_diagonal_scan(A, b)[0], (A, b), dh)
        fns = {"default": lambda: fb({}),
               "lb2_bwd": lambda: fb(dict(bd2_bwd_lookback=True)),
               "no_lb2_bwd": lambda: fb(dict(bd2_bwd_lookback=False)), "ring": lambda: fb(dict(bd2_lookback=False, bd2_tma=False))}
        ref = fns["no_lb2_bwd"]()
        e = max(_rel(x, y.double()) for x, y in zip(fns["lb2_bwd"](), ref))
        fails += not e < 1e-5
        print(f"B{B} T{T} N{N} lb2_bwd gradients: rel to no_lb2_bwd {e:.2e} {'ok' if e < 1e-5 else 'FAIL'}",
              flush=True)
        key = f"B{B} T{T} N{N}"
        rows[key] = timed_rounds(fns, (2 * A.numel() + 4 * b.numel()) * 4, rounds)  # A, b, dh, h; dA, db
        line = " ".join(f"{k} {v:.4f}" for k, v in rows[key].items())
        print(f"{key} m=2 fwd+bwd fp32, ms: {line}", flush=True)
    return rows, fails


def render(path, results, note=""):
    """Append the JSON of a run (this tool's, ``lb4_compare.py``'s or ``tune_compare.py``'s) as a
    Markdown table (ms and % of the same-size copy) to ``results``."""
    d = json.loads(Path(path).read_text())
    meta, rows = d["meta"], d["rows"]
    cols = list(next(iter(rows.values())))
    sep = "; " if note and not note.startswith(";") else ""
    with open(results, "a") as fh:
        name, _, flags = meta.get("tool", "lb%d_compare" % meta.get("m", 2)).partition(" ")
        how = "eager do_bench medians (L2 flushed)" if "--eager" in flags else "CUDA-graph medians"
        fh.write(f"\n## {name}.py{' ' + flags if flags else ''} — {meta['date']} — {meta['device']}, torch {meta['torch']}, "
                 f"Triton {meta['triton']}; m = {meta.get('m', 2)} {meta.get('kind', 'fwd')}, {meta.get('dtype', 'fp32')}, {how} "
                 f"of {meta['rounds']} interleaved rounds, ms (% of a copy of the same bytes); GPU "
                 f"checks failed: {meta['fails']}{sep}{note}\n\n")
        fh.write("| shape | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n")
        for key, r in rows.items():
            cells = " | ".join(f"{r[c]:.4f} ({r['copy'] / r[c] * 100:.0f})" for c in cols)
            fh.write(f"| {key} | {cells} |\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", default=None, help="a JSON of this tool to append to --results")
    ap.add_argument("--results", default="benchmarks/RESULTS.md")
    ap.add_argument("--note", default="", help="appended to the rendered section's heading")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--bwd", action="store_true", help="forward+backward rows (lookback2_bwd.py)")
    ap.add_argument("--shapes", nargs="+", default=[f"{B}x{T}x{N}" for B, T, N in SHAPES],
                    help="BxTxN (N = 2 x blocks)")
    args = ap.parse_args()
    if args.render:
        return render(args.render, args.results, args.note)
    shapes = [tuple(int(x) for x in sh.split("x")) for sh in args.shapes]
    fails = 0 if args.no_check else check()
    rows = {}
    if args.bwd:
        rows, nbad = bwd_rows(args.rounds, shapes)
        return _finish(args, fails + nbad, rows)
    for B, T, N in shapes:
        H = N // 2
        A, b = _inputs(B, T, H, torch.float32)
        fns = {"default": lambda: S.block_diagonal_scan(A, b)}
        fns["ring"] = lambda: _ring(A, b)
        for name, tune in CONFIGS.items():
            fns[name] = (lambda tune=tune: bd2_lookback_forward(A, b, None, None, tune, S._empty))
        ref = _ring(A, b)[0]
        for name, fn in fns.items():
            if name.startswith("lb2"):
                e = _rel(fn()[0], ref.double())
                if not e < 1e-5:
                    print(f"B{B} T{T} N{N} {name}: rel to ring {e:.2e} FAIL", flush=True)
                    fails += 1
        key = f"B{B} T{T} N{N}"
        rows[key] = timed_rounds(fns, (A.numel() + 2 * b.numel()) * 4, args.rounds)
        cp = rows[key]["copy"]
        line = " ".join(f"{k} {v:.4f} ({cp / v * 100:.0f}%)" for k, v in rows[key].items())
        print(f"{key} m=2 fwd fp32, ms (% of same-size copy): {line}", flush=True)
        del A, b
    return _finish(args, fails, rows)


def _finish(args, fails, rows, m=2, tool=None, stem=None, dtype="fp32"):
    """Write ``<stem>[_bwd].json`` (rows and the run's device, versions, date, failed checks) to
    ``args.out``; ``tool`` (the script's name in the rendered heading) defaults to ``lb<m>_compare``,
    ``stem`` to ``tool`` (also ``lb4_compare.py``'s and ``tune_compare.py``'s writer); exit status 1
    if any check failed."""
    tool = tool or f"lb{m}_compare"
    stem = stem or tool
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__,
                date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"),
                rounds=args.rounds, fails=fails, kind="fwd+bwd" if args.bwd else "fwd", m=m, tool=tool,
                dtype=dtype)
    out = Path(args.out, f"{stem}_bwd.json" if args.bwd else f"{stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)  # a missing --out folder lost a whole GPU run once
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(meta)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
