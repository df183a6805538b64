"""Is the m = 1 forward's gap to accelerated-scan the scan or the walk over the layout?

The thirty-fourth session's Nsight Compute profile (RESULTS.md) found our m = 1 forward on
``(B, T, N)`` and accelerated-scan on ``(B, N, T)`` moving the same bytes, with DRAM at 82-86 %
against 87-88 % of peak. This times kernels that move the same bytes as the scan (read ``a`` and
``b``, write ``h``) with **no recurrence** (``h = a + b``), walking the data the way a scan must:
one program per (sequence, channel tile) that steps through time, loading the next tile while it
handles this one (as the tile kernel, ``fwd._diag_fwd_kernel``). Layouts:

* ``btn``: ``(B, T, N)`` tiles of ``BT`` steps x ``BN`` channels (rows of ``4 BN`` bytes at a
  stride of ``4 N``), the layout of our scan;
* ``bnt``: ``(B, N, T)`` tiles of ``BN`` channels x ``BT`` contiguous steps, accelerated-scan's.

With them, in the same interleaved rounds: ``torch.add`` over the flat tensors (no walk at all),
our m = 1 forward (``diagonal_scan``, default) and accelerated-scan's forward if installed. If the
``btn`` walk is as slow as our scan while the ``bnt`` walk is as fast as accelerated-scan, the gap
comes from the walk over the layout, not from the scan's arithmetic.

    python tools/walk_order_probe.py [--shapes 8x2048x4096] [--rounds 3] [--flush-l2 256] \
        [--walks btn:32x64x2 btn:32x64x2x4 bnt:1024x1x4] [--out DIR]

A walk is ``LAYOUT:BTxBNxWARPS[xCHUNKS]`` with ``BN`` channels and ``BT`` steps per tile, time
split into ``CHUNKS`` programs (default 1: the whole sequence, as the scan). Every output is
checked against ``a + b`` (exactly) and the scan against accelerated-scan's where both exist.
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
import triton.language as tl

from lrnn_scan.bench.measure import graph_time
from lrnn_scan.kernels.block_diagonal import diagonal_scan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from scan_peers import try_accelerated_scan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diag_tile_vs_accel  # noqa: E402  (flushed_timer, random_inputs)

DEVICE = "cuda"       # the CPU smoke test (tests/test_tools_device.py) sets "cpu" (interpreter)
BENCH = graph_time
WALKS = ["btn:32x64x2", "btn:64x64x4", "btn:16x128x2", "btn:16x256x4", "bnt:256x4x4", "bnt:1024x1x4"]


@triton.jit
def _walk_add_kernel(A, Bv, H, T, N, CHUNK, BT: tl.constexpr, BN: tl.constexpr,
                     TIME_MAJOR: tl.constexpr):
    """``H = A + Bv`` tile after tile along time, the next tile's loads issued before this tile's
    store (the scan's walk without its recurrence). Grid: (channel tiles, sequences, time
    chunks); a program walks steps ``[c CHUNK, (c + 1) CHUNK)`` (``CHUNK`` a multiple of BT)."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    t0 = tl.program_id(2) * CHUNK
    t1 = tl.minimum(t0 + CHUNK, T)
    base = tl.program_id(1).to(tl.int64) * T * N
    r = tl.arange(0, BT)
    if TIME_MAJOR:   # (B, N, T): the tile's BT steps of a channel are contiguous
        offs0 = base + n[None, :].to(tl.int64) * T + r[:, None]
        step = tl.full([], 1, tl.int64)
    else:            # (B, T, N): the tile's BN channels of a step are contiguous
        offs0 = base + r[:, None].to(tl.int64) * N + n[None, :]
        step = N.to(tl.int64)   # int64: ts * N passes 2^31 in long sequences
    m0 = ((t0 + r) < t1)[:, None] & (n < N)[None, :]
    a_nxt = tl.load(A + offs0 + t0 * step, mask=m0, other=0.0)
    b_nxt = tl.load(Bv + offs0 + t0 * step, mask=m0, other=0.0)
    for ts in range(t0, t1, BT):
        offs = offs0 + ts * step
        m = ((ts + r) < t1)[:, None] & (n < N)[None, :]
        av, bv = a_nxt, b_nxt
        m_nxt = ((ts + BT + r) < t1)[:, None] & (n < N)[None, :]
        a_nxt = tl.load(A + offs + BT * step, mask=m_nxt, other=0.0)
        b_nxt = tl.load(Bv + offs + BT * step, mask=m_nxt, other=0.0)
        tl.store(H + offs, av + bv, mask=m)


def parse_walk(text: str):
    """``"btn:32x64x2"`` -> ``("btn", 32, 64, 2, 1)``, ``"btn:32x64x2x4"`` (4 time chunks) ->
    ``("btn", 32, 64, 2, 4)``; a clear error for anything else."""
    try:
        layout, dims = text.split(":")
        bt, bn, nw, *ck = map(int, dims.split("x"))
        ck = ck or [1]
        (ck,) = ck
    except ValueError:
        raise SystemExit(f"--walks: {text!r} is not LAYOUT:BTxBNxWARPS[xCHUNKS] (e.g. btn:32x64x2)") from None
    if layout not in ("btn", "bnt") or min(bt, bn, nw, ck) < 1 or any(v & (v - 1) for v in (bt, bn, nw)):
        raise SystemExit(f"--walks: {text!r}: LAYOUT is btn or bnt, BT, BN and WARPS powers of two")
    return layout, bt, bn, nw, ck


def walk_add(a, b, h, layout: str, bt: int, bn: int, nw: int, chunks: int = 1):
    """Launch ``_walk_add_kernel`` on ``a``, ``b``, ``h`` of shape ``(B, T, N)`` (``btn``) or
    ``(B, N, T)`` (``bnt``), time split into ``chunks`` walks of whole tiles."""
    B = a.shape[0]
    T, N = (a.shape[1], a.shape[2]) if layout == "btn" else (a.shape[2], a.shape[1])
    chunk = triton.cdiv(triton.cdiv(T, chunks), bt) * bt
    _walk_add_kernel[(triton.cdiv(N, bn), B, triton.cdiv(T, chunk))](
        a, b, h, T, N, chunk, BT=bt, BN=bn, TIME_MAJOR=layout == "bnt", num_warps=nw)
    return h


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8x2048x4096"], help="BxTxN")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--walks", nargs="+", default=WALKS)
    ap.add_argument("--flush-l2", type=int, default=0, metavar="MB",
                    help="overwrite MB before each replay and subtract that overwrite (cold L2)")
    ap.add_argument("--out", default="gpu_out")
    a_ = ap.parse_args(argv)
    walks = {w: parse_walk(w) for w in a_.walks}
    out = Path(a_.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = diag_tile_vs_accel.flushed_timer(a_.flush_l2, BENCH, DEVICE) if a_.flush_l2 else BENCH
    as_scan = try_accelerated_scan()
    dev = torch.device(DEVICE)
    env = dict(device=torch.cuda.get_device_name() if dev.type == "cuda" else "CPU interpreter",
               torch=torch.__version__, triton=triton.__version__, flush_l2_mb=a_.flush_l2,
               date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    print(env, flush=True)
    rows = []
    for shape in a_.shapes:
        a, x, _ = diag_tile_vs_accel.random_inputs(shape, dev)
        B, T, N = a.shape
        at, xt = a.transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous()
        want, want_t = a + x, at + xt
        h, ht = torch.full_like(a, float("nan")), torch.full_like(at, float("nan"))
        fns, checks = {"torch.add (flat)": lambda: torch.add(a, x, out=h)}, {}
        for w, (layout, *cfg) in walks.items():
            src = (a, x, h, want) if layout == "btn" else (at, xt, ht, want_t)
            src[2].fill_(float("nan"))     # an unwritten element fails the check
            walk_add(*src[:3], layout, *cfg)
            checks[w] = dict(exact=bool(torch.equal(src[2], src[3])))
            fns[w] = (lambda s=src, c=(layout, *cfg): walk_add(*s[:3], *c))
        fns["scan (ours, default)"] = lambda: diagonal_scan(a, x)
        if as_scan is not None:
            ours = diagonal_scan(a, x)[0].transpose(1, 2)
            checks["scan (ours, default)"] = dict(vs_accelerated_scan=(
                (ours - as_scan(at, xt)).norm() / ours.norm()).item())
            fns["accelerated-scan"] = lambda: as_scan(at, xt)
        times = {n: [] for n in fns}
        for _ in range(a_.rounds):        # interleaved: drift hits every column alike
            for n, f in fns.items():
                times[n].append(bench(f, rep=40, return_mode="median"))
        nbytes = 3 * B * T * N * 4
        peer = statistics.median(times["accelerated-scan"]) if as_scan is not None else None
        for n in fns:
            ms = statistics.median(times[n])
            rows.append(dict(B=B, T=T, N=N, kernel=n, graph_ms=round(ms, 5),
                             rounds=[round(v, 5) for v in times[n]], tbs=round(nbytes / ms / 1e9, 3),
                             accel_over_this=round(peer / ms, 3) if peer else None, **checks.get(n, {})))
            print(f"B{B} T{T} N{N} {n:22s} {ms:8.4f} ms {nbytes / ms / 1e9:6.3f} TB/s "
                  f"accelerated-scan/this {rows[-1]['accel_over_this']} {checks.get(n, '')}", flush=True)
        if not all(c.get("exact", True) for c in checks.values()):
            raise SystemExit(f"a walk wrote wrong or missing elements: {checks}")
        del a, x, at, xt, h, ht, want, want_t, fns
    (out / "walk_order_probe.json").write_text(json.dumps(dict(**env, rows=rows), indent=1))
    with open(out / "RESULTS_walk.md", "a") as f:
        f.write(f"\n## tools/walk_order_probe.py, {env['date']}\n\n{env['device']}, torch {env['torch']}, "
                f"Triton {env['triton']}; fp32; h = a + b walked like the m = 1 scan (no recurrence); "
                f"graph ms = median of {a_.rounds} interleaved rounds of do_bench_cudagraph medians"
                + (f", each replay after a {a_.flush_l2} MB overwrite (its time subtracted)" if a_.flush_l2 else "")
                + "; walk = LAYOUT:BTxBNxWARPS[xCHUNKS]; TB/s = 3 x 4 bytes an element.\n\n"
                "| B | T | N | kernel | graph ms | TB/s | accelerated-scan / this |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['B']} | {r['T']} | {r['N']} | {r['kernel']} | {r['graph_ms']} | {r['tbs']} | "
                    f"{r['accel_over_this']} |\n")
    print(f"wrote {out}/walk_order_probe.json and RESULTS_walk.md", flush=True)


if __name__ == "__main__":
    main()
