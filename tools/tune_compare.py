"""Any ``scan.TUNE`` settings of the block-diagonal scan against the default, for any m, on a GPU:
CUDA-graph medians in interleaved rounds (fp32, or ``--dtype bf16`` / ``fp16``) with a copy of
the same bytes in the same run, forward (``A``, ``b`` read, ``h`` written) or, with ``--bwd``,
forward+backward (``A``, ``b``, ``dh``, ``h`` read; ``dA``, ``db`` written). Each column's outputs
(gradients with ``--bwd``) are compared with the default's (relative RMS under ``_TOL``: 1e-5 in
fp32, where the arithmetic per block is the same and only the kernels' tiling differs): a
mismatch counts as a failed check. The float64 checks of the kernels
themselves are the GPU tests'.

    python tools/tune_compare.py --m 4 --shapes 8x2048x768 16x1024x768 \\
        --tune bh4=bh:4+num_warps:1 'v1ns24={"bwd_ns": 24}' [--bwd] [--rounds 3] [--out DIR] \\
        [--compiled]
    python tools/lb2_compare.py --render OUT/tune_compare_m4.json --results benchmarks/RESULTS.md
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.bench.inputs import stable_blocks  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lb2_compare import _finish, _rel, timed_rounds  # noqa: E402  (JSON writer, helpers)
from benchmarks.kernel_times import kernel_times  # noqa: E402


def _value(text):
    """A compact value: JSON scalars (``4``, ``0.5``, ``true``), anything else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_tune(items):
    """``NAME=JSON`` or ``NAME=key:value+key:value`` words (the compact form has no commas or
    spaces, so it passes through ``tools/gpu_pair.sh``) -> ``{NAME: dict}``; a clear error for a
    malformed word."""
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name or not text:
            raise SystemExit(f"--tune {item!r}: expected NAME=JSON or NAME=key:value+key:value, "
                             "e.g. 'bh4=bh:4+num_warps:1'")
        if text.startswith("{"):
            try:
                tune = json.loads(text)
            except json.JSONDecodeError as e:
                raise SystemExit(f"--tune {item!r}: the part after '=' is not JSON ({e})") from None
        else:
            pairs = [p.partition(":") for p in text.split("+")]
            if any(not k or not s or not v for k, s, v in pairs):
                raise SystemExit(f"--tune {item!r}: expected key:value pairs joined by '+'")
            tune = {k: _value(v) for k, _, v in pairs}
        if not isinstance(tune, dict):
            raise SystemExit(f"--tune {item!r}: expected a JSON object of TUNE keys, got {type(tune).__name__}")
        out[name] = tune
    return out


def kernel_breakdown(fns, reps=10):
    """Prints each column's GPU kernels (``torch.profiler``): microseconds per call and launches
    per call, largest first, to see which pass of a multi-pass call takes the time."""
    for name, fn in fns.items():
        rows = sorted(((us, n, key) for key, (us, n) in kernel_times(fn, reps=reps, warmup=1).items()),
                      reverse=True)
        total = sum(r[0] for r in rows)
        print(f"kernels of {name}: {total:.1f} us a call")
        for us, n, key in rows:
            print(f"  {us:9.1f} us  {n:4.1f}x  {key[:110]}")


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# the worst relative difference to the default column a check allows: fp32 sums in another order
# (tiling) differ by rounding; 16-bit outputs and gradients can round one ulp apart (2^-8 bf16)
_TOL = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}


def rows_for(m, shape, tunes, bwd, rounds, compiled=False, kernels=False, dtype="fp32"):
    """One shape's medians (ms) by column and the worst relative difference to the default.
    ``dtype``: the inputs' (``_DTYPES``; the scan keeps fp32 state and accumulation either way).
    ``compiled``: every column through ``torch.compile`` of ``lrnn_scan.compile``'s custom op
    (the plan is made in the op at run time, so ``TUNE`` still applies), and an ``eager`` column.
    ``kernels``: also print each column's GPU kernels (``kernel_breakdown``)."""
    B, T, N = shape
    scan = S.block_diagonal_scan
    if compiled:
        import lrnn_scan.compile as lc
        lc.register()  # before tracing: Dynamo cannot trace the ops' definition (imports)
        torch._dynamo.reset()
        scan = torch.compile(lambda A, b: lc.block_diagonal_scan(A, b), fullgraph=True)
    if N % m:
        raise SystemExit(f"--shapes {B}x{T}x{N}: N must be a multiple of m = {m}")
    g = torch.Generator(device="cuda").manual_seed(0)
    A = stable_blocks(B, T, N // m, m, m, generator=g, device="cuda").to(_DTYPES[dtype])
    b = torch.randn(B, T, N // m, m, device="cuda", generator=g).to(_DTYPES[dtype])
    size = A.element_size()
    if bwd:
        A.requires_grad_()
        b.requires_grad_()
        dh = torch.randn_like(b)
        nbytes = (2 * A.numel() + 4 * b.numel()) * size

        def run(tune, fn=scan):
            with S.tuned(tune):
                return torch.autograd.grad(fn(A, b)[0], (A, b), dh)
    else:
        nbytes = (A.numel() + 2 * b.numel()) * size

        def run(tune, fn=scan):
            with S.tuned(tune):
                return fn(A, b)[:1]
    fns = {"default": lambda: run({}), **{k: (lambda t=t: run(t)) for k, t in tunes.items()}}
    if compiled:
        fns["eager"] = lambda: run({}, S.block_diagonal_scan)
    ref = [x.double() for x in fns["default"]()]
    worst = max([0.0] + [_rel(x, y) for k, fn in fns.items() if k != "default" for x, y in zip(fn(), ref)])
    if kernels:
        print(f"B{B} T{T} N{N} m={m}:")
        kernel_breakdown(fns)
    return timed_rounds(fns, nbytes, rounds), worst


def shape_rows(shapes, label, bwd, rows_fn, dtype="fp32"):
    """``rows_fn((B, T, N)) -> (medians by column, worst relative difference to the default)`` for
    each ``BxTxN`` word, one printed line a shape; returns ``(failed checks, rows by shape)`` (also
    ``gate_tune_compare.py``'s loop). A difference of ``_TOL[dtype]`` or more fails a check."""
    fails, rows = 0, {}
    for sh in shapes:
        B, T, N = (int(x) for x in sh.split("x"))
        key = f"B{B} T{T} N{N}"
        rows[key], worst = rows_fn((B, T, N))
        fails += not worst < _TOL[dtype]
        cp = rows[key]["copy"]
        line = " ".join(f"{k} {v:.4f} ({cp / v * 100:.0f}%)" for k, v in rows[key].items())
        print(f"{key} {label} {'fwd+bwd' if bwd else 'fwd'} {dtype}, ms (% of same-size copy): {line}; "
              f"worst rel. diff to default {worst:.1e}{'' if worst < _TOL[dtype] else ' MISMATCH'}",
              flush=True)
    return fails, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, required=True, help="block size")
    ap.add_argument("--shapes", nargs="+", default=["8x2048x768"], help="BxTxN (N = m x blocks)")
    ap.add_argument("--tune", nargs="*", default=[], help="columns NAME=JSON of TUNE overrides")
    ap.add_argument("--bwd", action="store_true", help="forward+backward rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compiled", action="store_true",
                    help="columns through torch.compile (lrnn_scan.compile), plus an eager column")
    ap.add_argument("--kernels", action="store_true",
                    help="also print each column's GPU kernels (torch.profiler, us a call)")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="fp32", help="inputs' dtype (default fp32)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    tunes = parse_tune(args.tune)
    fails, rows = shape_rows(args.shapes, f"m={args.m}", args.bwd, lambda shape: rows_for(
        args.m, shape, tunes, args.bwd, args.rounds, args.compiled, args.kernels, args.dtype), args.dtype)
    print("tunes:", json.dumps(tunes))
    stem = f"tune_compare_m{args.m}" + ("_compiled" if args.compiled else "") + (
        "" if args.dtype == "fp32" else f"_{args.dtype}")
    return _finish(args, fails, rows, m=args.m, tool="tune_compare" + (" --compiled" if args.compiled else ""),
                   stem=stem, dtype=args.dtype)


if __name__ == "__main__":
    sys.exit(main())
