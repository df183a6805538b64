"""The m = 4 look-back forward (``kernels/block_diagonal/lookback4.py``) on a GPU against the
default (``TUNE`` empty: the look-back below two ring programs per SM) and the forward without it
(``ring``: ring kernels, chunked where the rule chunks). First correctness against the float64 reference on the GPU (outputs and final states,
NaN-poisoned buffers, varlen, windows of 1, inclusive states withheld so that look-backs walk to
chunk 0, bf16, each case 5 times to catch races), then CUDA-graph medians in interleaved rounds
(fp32) with a copy of the same bytes in the same run: forward rows for several chunk / window
configurations, or (``--bwd``) forward+backward rows against the default: ``ring`` neither
look-back (ring / chunked passes), ``lb4`` the look-back forward forced, then the one-pass ring
backward; ``lb4_bwd`` both look-backs (``lookback4_bwd.py``) forced.

    python tools/lb4_compare.py [--rounds 3] [--out DIR] [--no-check] [--bwd] [--shapes 8x2048x768 ...]
    python tools/lb2_compare.py --render OUT/lb4_compare.json --results benchmarks/RESULTS.md
"""
import argparse
import os
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.kernels.block_diagonal import ref, scan as S  # noqa: E402
from lrnn_scan.kernels.block_diagonal.lookback4 import bd4_lookback_forward  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lb2_compare import _finish, _inputs as _inputs2, _rel, timed_rounds  # noqa: E402  (the m = 2 tool's helpers)

SHAPES = ["8x2048x768", "4x4096x768", "1x16384x768", "16x1024x768", "8x2048x1536", "8x2048x4096"]
CONFIGS = ["c8w1", "c8w2", "c4w1", "c16w1"]


def _config(name):
    """``c<CHUNK>w<W>`` with an optional suffix ``b64`` (two warps a tile) -> the ``TUNE`` keys."""
    m = re.fullmatch(r"c(\d+)w(\d+)(b64)?", name)
    if not m:
        raise ValueError(f"config {name!r}: expected c<CHUNK>w<W>[b64]")
    return dict(lb4_chunk=int(m[1]), lb4_window=int(m[2]), lb4_bh=64 if m[3] else 32)


def _inputs(B, T, H, dtype, seed=0):
    """``lb2_compare._inputs`` with 4 x 4 blocks."""
    return _inputs2(B, T, H, dtype, seed, m=4)


def check():
    """The number of failed cases; one line per case. Buffers the launcher allocates start as NaN
    (``LRNN_SCAN_POISON``, read by ``scan._empty``), so an unwritten element fails."""
    os.environ["LRNN_SCAN_POISON"] = "1"
    fails = 0
    cases = [((2, 1037, 100), None, dict()), ((1, 3001, 192), None, dict(lb4_window=1)),
             ((1, 1000, 64), [0, 1, 1, 63, 65, 400, 1000], dict(lb4_chunk=4)),
             ((1, 2000, 200), [0, 700, 701, 2000], dict(lb_publish_incl=False)),
             ((1, 5003, 192), [0, 1000, 1001, 3333, 5003], dict(lb4_chunk=16, lb4_window=4)),
             ((8, 2048, 192), None, dict(lb4_bh=64))]
    try:
        for (B, T, H), cu, tune in cases:
            A, b = _inputs(B, T, H, torch.float32, seed=T)
            cut = None if cu is None else torch.tensor(cu, device="cuda")
            h0 = torch.randn(B if cu is None else len(cu) - 1, H, 4, device="cuda")
            hr, fr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True, cut)
            worst = 0.0
            for _ in range(5):  # races show as run-to-run differences
                h, fin, _ = bd4_lookback_forward(A, b, h0, cut, tune, S._empty)
                worst = max(worst, _rel(h, hr), _rel(fin, fr), float(torch.isnan(h).any()))
            fails += not worst < 1e-5
            print(f"check B{B} T{T} H{H} cu={cu} {tune}: worst rel {worst:.2e} "
                  f"{'ok' if worst < 1e-5 else 'FAIL'}", flush=True)
        A, b = _inputs(2, 1037, 100, torch.bfloat16)
        h, fin, _ = bd4_lookback_forward(A, b, None, None, {}, S._empty)
        hr, fr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True)
        e = max(_rel(h, hr), _rel(fin, fr))
        fails += not e < 5e-3
        print(f"check bf16 B2 T1037 H100: rel {e:.2e} {'ok' if e < 5e-3 else 'FAIL'}", flush=True)
    finally:
        os.environ.pop("LRNN_SCAN_POISON")
    return fails


def _ring(A, b):
    with S.tuned(dict(bd4_lookback=False, bd4_tma=False)):
        return S.block_diagonal_scan(A, b)


def rows_for(shape, bwd, rounds, configs):
    """One shape's medians (ms) by column, and whether the look-back's outputs (gradients with
    ``bwd``) matched the default's within 1e-5."""
    B, T, N = shape
    A, b = _inputs(B, T, N // 4, torch.float32)
    if bwd:
        A.requires_grad_()
        b.requires_grad_()
        dh = torch.randn_like(b)
        nbytes = (2 * A.numel() + 4 * b.numel()) * 4  # A, b, dh, h read; dA, db written

        def run(tune):
            with S.tuned(tune):
                return torch.autograd.grad(S.block_diagonal_scan(A, b)[0], (A, b), dh)
        # since the nineteenth session the default takes lookback4_bwd.py with few ring programs
        # (bd4_bwd_lookback_use), so each column names its passes instead of leaning on the rule
        fns = {"default": lambda: run({}), "ring": lambda: run(dict(bd4_lookback=False, bd4_tma=False)),
               "lb4": lambda: run(dict(bd4_lookback=True, bd4_bwd_lookback=False)),
               "lb4_bwd": lambda: run(dict(bd4_bwd_lookback=True))}
    else:
        nbytes = (A.numel() + 2 * b.numel()) * 4
        fns = {"default": lambda: S.block_diagonal_scan(A, b)}
        fns["ring"] = lambda: _ring(A, b)
        for name in configs:
            fns["lb4_" + name] = lambda tune=_config(name): bd4_lookback_forward(A, b, None, None, tune, S._empty)[:1]
    ref_out = [x.double() for x in fns["default"]() if x is not None]
    ok = all(max(_rel(x, y) for x, y in zip(fn(), ref_out)) < 1e-5 for k, fn in fns.items() if k != "default")
    return timed_rounds(fns, nbytes, rounds), ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--bwd", action="store_true", help="forward+backward rows")
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="BxTxN (N = 4 x blocks)")
    ap.add_argument("--configs", nargs="+", default=CONFIGS, help="forward rows: c<CHUNK>w<W>[b64]")
    args = ap.parse_args(argv)
    fails = 0 if args.no_check else check()
    rows = {}
    for sh in args.shapes:
        B, T, N = (int(x) for x in sh.split("x"))
        key = f"B{B} T{T} N{N}"
        rows[key], ok = rows_for((B, T, N), args.bwd, args.rounds, args.configs)
        fails += not ok
        cp = rows[key]["copy"]
        line = " ".join(f"{k} {v:.4f} ({cp / v * 100:.0f}%)" for k, v in rows[key].items())
        print(f"{key} m=4 {'fwd+bwd' if args.bwd else 'fwd'} fp32, ms (% of same-size copy): {line}"
              f"{'' if ok else ' MISMATCH'}", flush=True)
    return _finish(args, fails, rows, m=4)


if __name__ == "__main__":
    sys.exit(main())
