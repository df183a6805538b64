"""Throughput of the materialised-A block-diagonal and diagonal scans against the memory roofline.

One run (on a CUDA GPU) measures: the device-to-device copy bandwidth (bytes read + written);
``block_diagonal_scan`` / ``diagonal_scan`` forward and forward+backward over block sizes m;
the peers available here (compiled torch ``associative_scan`` for m = 1, a compiled torch
log-depth doubling scan, an eager loop on one case, accelerated-scan if importable). Achieved
TB/s = bytes(inputs read once + outputs written once) / median time. The library's rows and
accelerated-scan's also get a CUDA-graph time (``graph_ms``: ``do_bench_cudagraph``, the GPU time
without host launch cost, which dominates the small fwd+bwd shapes). Writes CSV + JSON + a plot
under ``benchmarks/out/`` and appends a dated row set to ``benchmarks/RESULTS.md``.

    python benchmarks/scan_throughput.py            # full run
    python benchmarks/scan_throughput.py --quick    # fewer shapes, no peers
    python benchmarks/scan_throughput.py --skip-variants --no-graph   # no tuning rows, no graph timings
    python benchmarks/scan_throughput.py --tune     # sweep kernel configurations (prints only)
    python benchmarks/scan_throughput.py --lookback-compare  # m = 1 look-back forward vs the tiled/chunked one
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import signal
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

import triton
from triton.testing import do_bench

from lrnn_scan.bench.measure import graph_time
from lrnn_scan.kernels.block_diagonal import block_diagonal_scan, diagonal_scan
from lrnn_scan.kernels.block_diagonal import scan as _scanmod
from lrnn_scan.bench.inputs import stable_blocks

DEV = "cuda"


def bench(fn, warmup=10, rep=40):
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def bench_graph(fn, rep=40):
    """Median of CUDA-graph replays (``do_bench_cudagraph``): the GPU time without the host's
    Python/autograd/launch cost, which at the small shapes (B8 T2048 N768, B1 T16384) exceeds the
    GPU time of a backward (`tools/host_overhead.py`). ``None`` if the call cannot be captured."""
    try:
        return graph_time(fn, rep=rep)
    except Exception as e:  # keep the plain row
        print(f"graph capture failed: {e!r}"[:200], flush=True)
        return None


def copy_bandwidth():
    x = torch.randn(1 << 28, device=DEV)  # 1 GiB
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * 4 / ms / 1e9  # TB/s


def make_inputs(B, T, N, m, dtype=torch.float32, grad=False):
    H = N // m
    A = stable_blocks(B, T, H, m, m, device=DEV).to(dtype).contiguous()  # rows L1 = 0.99
    b = torch.randn(B, T, H, m, device=DEV, dtype=dtype)
    if grad:
        A.requires_grad_(True)
        b.requires_grad_(True)
    return A, b


def bytes_fwd(B, T, N, m, esize=4):
    return B * T * N * (m + 2) * esize  # A (N m per step) + b + h


def bytes_fwdbwd_floor(B, T, N, m, esize=4):
    # inputs read once: A, b, dh; outputs written once: h, dA, db
    return B * T * N * (2 * m + 4) * esize


def bytes_fwdbwd_passes(B, T, N, m, esize=4):
    # forward (A, b -> h) + backward (A, h, dh -> dA, db) without recomputation
    return B * T * N * (3 * m + 5) * esize


def ours_fwd(A, b):
    """Forward only: detached inputs, so the launcher picks its inference chunking (with
    gradients it keeps the chunking measured for forward+backward, see ``scan._choose_chunk``)."""
    A, b = A.detach(), b.detach()
    if A.shape[-1] == 1:
        Bb, T, H = b.shape[:3]
        a2, b2 = A.view(Bb, T, H), b.view(Bb, T, H)
        return lambda: diagonal_scan(a2, b2)
    return lambda: block_diagonal_scan(A, b)


def ours_fwdbwd(A, b):
    g = torch.randn_like(b)

    def run():
        h, _ = block_diagonal_scan(A, b)
        torch.autograd.grad(h, (A, b), g)
    return run


# ----------------------------------------------------------------------------- peers
try:                                        # as part of the benchmarks package
    from .scan_peers import (accelerated_scan_grad_ok, assoc_scan_m1, doubling_scan, eager_loop,
                             graph_ratio, try_accelerated_scan)
except ImportError:                         # run as a script: its folder is on sys.path
    from scan_peers import (accelerated_scan_grad_ok, assoc_scan_m1, doubling_scan, eager_loop,
                            graph_ratio, try_accelerated_scan)


# ----------------------------------------------------------------------------- correctness
def check_fp64(log):
    """Quick fwd + bwd check against an fp64 torch doubling scan on this GPU."""
    torch.manual_seed(0)
    worst = 0.0
    for (B, T, N, m) in [(2, 1000, 96, 1), (2, 1000, 96, 3), (2, 700, 96, 8), (1, 3000, 96, 32),
                         (1, 5000, 64, 4)]:
        A, b = make_inputs(B, T, N, m, grad=True)
        h0 = torch.randn(B, N // m, m, device=DEV, requires_grad=True)
        h, hf = block_diagonal_scan(A, b, h0, True)
        g, gf = torch.randn_like(h), torch.randn_like(hf)
        dA, db, dh0 = torch.autograd.grad((h * g).sum() + (hf * gf).sum(), (A, b, h0))
        Ad, bd, h0d = [x.detach().double().requires_grad_() for x in (A, b, h0)]
        b1 = bd.clone()
        b1[:, 0] = b1[:, 0] + (Ad[:, 0] @ h0d.unsqueeze(-1)).squeeze(-1)
        hr = doubling_scan(Ad, b1)
        rA, rb, rh0 = torch.autograd.grad((hr * g.double()).sum() + (hr[:, -1] * gf.double()).sum(),
                                          (Ad, bd, h0d))
        errs = {k: ((x.double() - y).norm() / y.norm()).item()
                for k, x, y in [("h", h, hr), ("hf", hf, hr[:, -1]), ("dA", dA, rA), ("db", db, rb),
                                ("dh0", dh0, rh0)]}
        worst = max(worst, max(errs.values()))
        log(f"check B{B} T{T} N{N} m{m}: " + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    return worst


# ----------------------------------------------------------------------------- main
def _pairs(m):
    """(bh, num_warps, elements per thread per step) candidates for the block kernels."""
    mp = triton.next_power_of_2(m)
    out = []
    for nw in (1, 2, 4, 8):
        for e in (4, 8):
            bh = 32 * nw * e // (mp * mp)
            if bh >= 1 and bh * mp * mp == 32 * nw * e:
                out.append((bh, nw, e))
    out.sort()
    return out[:3]


def run_tune(log, ms_sel=(2, 4, 8, 16, 32)):
    T = 2048
    for N in (768, 4096):
        for m in ms_sel:
            A, b = make_inputs(8, T, N, m)
            res = []
            for bh, nw, e in _pairs(m):
                for d in (8, 16):
                    if d * e > 64:
                        continue
                    for ch in ((0, 512) if N == 768 else (0,)):
                        _scanmod.TUNE.clear()
                        _scanmod.TUNE.update(bh=bh, num_warps=nw, d=d, chunk=ch)
                        try:
                            ms = bench(ours_fwd(A, b), warmup=5, rep=20)
                        except Exception as ex:  # noqa
                            log(f"  fail bh{bh} nw{nw} d{d}: {ex!r}"[:300])
                            continue
                        res.append((ms, bh, nw, d, ch))
            res.sort()
            for ms, bh, nw, d, ch in res[:3]:
                log(f"tune N{N} m{m}: {ms:.4f} ms {bytes_fwd(8, T, N, m) / ms / 1e9:.2f} TB/s "
                    f"bh={bh} nw={nw} d={d} chunk={ch}")
            del A, b
    _scanmod.TUNE.clear()
    for N in (768, 4096):
        A, b = make_inputs(8, T, N, 1)
        res = []
        for bt in (16, 32, 64):
            for bn in (32, 64, 128):
                for nw in (1, 2, 4):
                    _scanmod.TUNE.clear()
                    _scanmod.TUNE.update(bt=bt, bn=bn, num_warps_diag=nw)
                    ms = bench(ours_fwd(A, b), warmup=5, rep=20)
                    res.append((ms, bt, bn, nw))
        res.sort()
        for r in res[:3]:
            log(f"tune diag N{N}: {r[0]:.4f} ms {bytes_fwd(8, T, N, 1) / r[0] / 1e9:.2f} TB/s bt,bn,nw={r[1:]}")
    _scanmod.TUNE.clear()
    for m in (1, 4, 8, 32):
        A, b = make_inputs(1, 16384, 768, m, grad=True)
        ms = bench(ours_fwd(A, b), warmup=5, rep=20)
        ms2 = bench(ours_fwdbwd(A, b), warmup=5, rep=20)
        log(f"default B1 T16384 N768 m{m}: fwd {ms:.4f} ms {bytes_fwd(1, 16384, 768, m) / ms / 1e9:.2f} TB/s; "
            f"fwdbwd {ms2:.4f} ms {bytes_fwdbwd_floor(1, 16384, 768, m) / ms2 / 1e9:.2f} TB/s")
    for N in (768, 4096):
        for m in (2, 8, 32):
            A, b = make_inputs(8, T, N, m, grad=True)
            ms = bench(ours_fwd(A, b), warmup=5, rep=20)
            ms2 = bench(ours_fwdbwd(A, b), warmup=5, rep=20)
            log(f"default B8 T2048 N{N} m{m}: fwd {ms:.4f} ms {bytes_fwd(8, T, N, m) / ms / 1e9:.2f} TB/s; "
                f"fwdbwd {ms2:.4f} ms {bytes_fwdbwd_floor(8, T, N, m) / ms2 / 1e9:.2f} TB/s")


# ----------------------------------------------------------------------------- look-back (m = 1)
LOOKBACK_CONFIGS = ((32, 32), (64, 32), (128, 32), (64, 64))  # (TUNE lb_chunk, lb_bn)
LOOKBACK_SHAPES = ((8, 2048, 768), (1, 16384, 768), (8, 2048, 4096))  # (B, T, N), issue 3


def _diag_ref64(a, b, h0):
    """fp64 Hillis-Steele scan of ``h_t = a_t h_{t-1} + b_t`` on the GPU; a, b ``(B, T, N)``.
    Differentiable (torch ops), so it also gives reference gradients."""
    a, b = a.double(), b.double()
    b = torch.cat([b[:, :1] + a[:, :1] * h0.double()[:, None], b[:, 1:]], 1)
    d, T = 1, a.shape[1]
    while d < T:
        b = torch.cat([b[:, :d], a[:, d:] * b[:, :-d] + b[:, d:]], 1)
        a = torch.cat([a[:, :d], a[:, d:] * a[:, :-d]], 1)
        d *= 2
    return b


def _rel(x, y):
    return ((x.double() - y).norm() / y.norm()).item()


def lookback_compare(log, record, bw, shapes=LOOKBACK_SHAPES):
    """``--lookback-compare``: the single-pass look-back forward (``TUNE['fwd_lookback']=True``,
    kernels/block_diagonal/lookback.py) against the tiled/chunked m = 1 forward
    (``fwd_lookback=False``; "default" in the rows) at the issue-3 shapes,
    for the tile shapes of ``LOOKBACK_CONFIGS``: fp64 check (h0 and h_final included, error and its
    ratio to the default forward's error), forward ms / % of copy, fp32 (bf16 too at the first
    shape), and forward+backward with the look-back forward, and with the look-back backward too
    (``bwd_lookback``, lookback_bwd.py; gradients checked at the second shape)."""
    summary = []
    for i, (B, T, N) in enumerate(shapes):
        torch.manual_seed(0)
        a = 0.9 + 0.1 * torch.rand(B, T, N, device=DEV)  # |a| near 1: carries cross many chunks
        x = torch.randn(B, T, N, device=DEV)
        h0 = torch.randn(B, N, device=DEV)
        ref = _diag_ref64(a, x, h0)
        for dtype in ((torch.float32, torch.bfloat16) if i == 0 else (torch.float32,)):
            a_, x_ = a.to(dtype), x.to(dtype)
            ref_ = ref if dtype == torch.float32 else _diag_ref64(a_, x_, h0)
            nbytes = B * T * N * 3 * a_.element_size()
            tag = "" if dtype == torch.float32 else "_bf16"
            _scanmod.TUNE.clear()
            _scanmod.TUNE["fwd_lookback"] = False
            h, hf = diagonal_scan(a_, x_, h0, True)
            e_def = max(_rel(h, ref_), _rel(hf, ref_[:, -1]))
            t_def = record("fwd", "diag_default" + tag, B, T, N, 1, bench(lambda: diagonal_scan(a_, x_)),
                           nbytes, err=float(f"{e_def:.2e}"))
            summary.append((B, T, N, "default" + tag, t_def, nbytes, e_def, 1.0))
            for ch, bn in (LOOKBACK_CONFIGS if not tag else LOOKBACK_CONFIGS[1:2]):
                _scanmod.TUNE.clear()
                _scanmod.TUNE.update(fwd_lookback=True, lb_chunk=ch, lb_bn=bn)
                try:
                    h, hf = diagonal_scan(a_, x_, h0, True)
                    e = max(_rel(h, ref_), _rel(hf, ref_[:, -1]))
                    t = bench(lambda: diagonal_scan(a_, x_))
                except Exception as ex:  # keep the other rows
                    log(f"lookback c{ch} bn{bn} B{B} T{T} N{N}{tag} failed: {ex!r}"[:300])
                    continue
                record("fwd", f"lookback_c{ch}_bn{bn}{tag}", B, T, N, 1, t, nbytes,
                       err=float(f"{e:.2e}"), err_ratio=round(e / e_def, 2),
                       speedup_vs_default=round(t_def / t, 3))
                summary.append((B, T, N, f"lookback c{ch} bn{bn}{tag}", t, nbytes, e, e / e_def))
        # forward+backward with the look-back forward (128 x 32 tiles), gradients checked once
        ag, xg = a.clone().requires_grad_(), x.clone().requires_grad_()
        g = torch.randn_like(x)
        for name, tune in (("default", dict(fwd_lookback=False)),
                           ("lookback_c128_bn32", dict(fwd_lookback=True)),
                           ("lookback_c128_bn32_bwdlb", dict(fwd_lookback=True, bwd_lookback=True))):
            _scanmod.TUNE.clear()
            _scanmod.TUNE.update(tune)
            if i == 1:
                h0g = h0.clone().requires_grad_()
                h, _ = diagonal_scan(ag, xg, h0g)
                grads = torch.autograd.grad((h * g).sum(), (ag, xg, h0g))
                ad, xd, h0d = (v.detach().double().requires_grad_() for v in (a, x, h0))
                rgrads = torch.autograd.grad((_diag_ref64(ad, xd, h0d) * g.double()).sum(), (ad, xd, h0d))
                log(f"fwd+bwd {name} B{B} T{T} N{N} gradient errors (da, db, dh0): "
                    + " ".join(f"{_rel(u, v):.2e}" for u, v in zip(grads, rgrads)))
            tb = bench(lambda: torch.autograd.grad(diagonal_scan(ag, xg)[0], (ag, xg), g))
            record("fwdbwd", f"{name}_fwd", B, T, N, 1, tb, B * T * N * 24)
        del a, x, ref, ag, xg, g
        torch.cuda.empty_cache()
    _scanmod.TUNE.clear()
    log(f"\nlook-back forward vs default (copy {bw:.3f} TB/s; err = max rel. error of h, h_final "
        f"against fp64; ratio = err / default's err)")
    log(f"{'shape':18s} {'impl':26s} {'ms':>8s} {'% copy':>7s} {'err':>9s} {'ratio':>6s}")
    for B, T, N, impl, t, nbytes, e, ratio in summary:
        log(f"{f'B{B} T{T} N{N}':18s} {impl:26s} {t:8.4f} {100 * nbytes / t / 1e9 / bw:7.1f} "
            f"{e:9.2e} {ratio:6.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", nargs="+", default=None, metavar="BxTxN",
                    help="the block-size table's shapes (default: 8x2048x768 8x2048x4096 1x16384x768)")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-graph", action="store_true",
                    help="skip the CUDA-graph timings (graph_ms) of the library and peer rows")
    ap.add_argument("--skip-variants", action="store_true",
                    help="skip the forward-variant and m = 1 tile sweeps (tuning rows)")
    ap.add_argument("--bwd-compare", action="store_true",
                    help="only compare the backward kernel variants ring2, ring4, g4, v1 "
                         "(fp64 check + fwd+bwd timings)")
    ap.add_argument("--lookback-compare", action="store_true",
                    help="only the m = 1 single-pass look-back forward (TUNE['fwd_lookback']) "
                         "against the tiled/chunked forward: fp64 checks + timings")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"),
                    help="markdown file the dated rows are appended to")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    props = torch.cuda.get_device_properties(0)
    env = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
               triton=triton.__version__, date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    log(f"env: {env}")
    worst = check_fp64(log)
    log(f"fp64 check worst relative error: {worst:.2e}")
    if args.tune:
        run_tune(log)
        return
    if args.bwd_compare:
        variants = ("ring2", "ring4", "g4", "v1")
        for var in variants:
            _scanmod.TUNE.clear()
            _scanmod.TUNE["bwd_variant"] = var
            log(f"bwd_variant={var}: fp64 check worst {check_fp64(log):.2e}")
        for (B, T, N) in ((8, 2048, 4096), (8, 2048, 768), (1, 16384, 768)):
            for m in ((2, 4, 8, 16, 32) if N == 4096 else (2, 4, 8)):
                A, b = make_inputs(B, T, N, m, grad=True)
                for var in variants:
                    _scanmod.TUNE.clear()
                    _scanmod.TUNE["bwd_variant"] = var
                    t = bench(ours_fwdbwd(A, b))
                    log(f"fwdbwd bwd_variant={var} B{B} T{T} N{N} m{m}: {t:.4f} ms "
                        f"{bytes_fwdbwd_floor(B, T, N, m) / t / 1e9:.3f} TB/s (floor)")
                del A, b
        return
    bw = copy_bandwidth()
    log(f"copy bandwidth: {bw:.3f} TB/s")
    rows = []

    def record(kind, impl, B, T, N, m, ms, nbytes, graph_fn=None, **extra):
        """One row; with ``graph_fn`` (and without ``--no-graph``) also the CUDA-graph time and
        its % of copy (``graph_ms``, ``graph_pct_copy``)."""
        tbs = nbytes / ms / 1e9
        if graph_fn is not None and not args.no_graph:
            gms = bench_graph(graph_fn)
            if gms is not None:
                extra = dict(graph_ms=round(gms, 5),
                             graph_pct_copy=round(100 * nbytes / gms / 1e9 / bw, 1), **extra)
        row = dict(kind=kind, impl=impl, B=B, T=T, N=N, m=m, ms=round(ms, 5),
                   tbs=round(tbs, 4), pct_copy=round(100 * tbs / bw, 1), **extra)
        rows.append(row)
        log(f"{kind:8s} {impl:22s} B{B} T{T} N{N} m{m}: {ms:8.4f} ms {tbs:6.3f} TB/s "
            f"{100 * tbs / bw:5.1f}% {extra if extra else ''}")
        return ms

    if args.lookback_compare:
        lookback_compare(log, record, bw)
        _write_outputs(out, args, env, bw, rows, worst, [], log)
        return
    # a run cut by `timeout` (SIGTERM) still writes the rows it measured, marked partial
    signal.signal(signal.SIGTERM, _raise_interrupt)
    shapes = []
    try:
        # forward kernel variants: ring of 16 / 8 slots (ring4 is the default), hand-pipelined 4-step
        # groups, one step per iteration
        for N in ((768, 4096) if not args.skip_variants else ()):
            for m in (2, 8, 32):
                A, b = make_inputs(8, 2048, N, m)
                for var in ("ring4", "ring2", "g4", "v1"):
                    _scanmod.TUNE.clear()
                    _scanmod.TUNE["variant"] = var
                    record("fwd", f"variant_{var}", 8, 2048, N, m, bench(ours_fwd(A, b)), bytes_fwd(8, 2048, N, m))
                del A, b
        _scanmod.TUNE.clear()
        # m = 1 tile configuration: pick the fastest here and use it for the rows below
        a1, x1 = torch.rand(8, 2048, 4096, device=DEV), torch.randn(8, 2048, 4096, device=DEV)
        best = None
        for bt in ((16, 32, 64) if not args.skip_variants else ()):
            for bn in (32, 64):
                for nw in (2, 4):
                    _scanmod.TUNE.clear()
                    _scanmod.TUNE.update(bt=bt, bn=bn, num_warps_diag=nw)
                    t = record("fwd", f"diag_bt{bt}_bn{bn}_nw{nw}", 8, 2048, 4096, 1,
                               bench(lambda: diagonal_scan(a1, x1)), 8 * 2048 * 4096 * 12)
                    best = min(best or (t, bt, bn, nw), (t, bt, bn, nw))
        del a1, x1
        # the rows below time the library's defaults: the forward sweep's winner used to be applied to
        # them, and on 2026-11-22 03:45 (bt32 bn64) it halved the programs, which switched the m = 1
        # forward+backward to the chunked path (0.8991 ms against 0.6000 ms with the defaults)
        _scanmod.TUNE.clear()
        if best:
            log(f"fastest diag forward config: bt={best[1]} bn={best[2]} num_warps={best[3]} (not applied)")
        ms_list = (1, 2, 4, 8, 16, 32)
        shapes = [(8, 2048, 768), (8, 2048, 4096), (1, 16384, 768)]
        if args.shapes:
            shapes = [tuple(int(x) for x in sh.split("x")) for sh in args.shapes]
        if args.quick:
            ms_list = (1, 4, 8, 32)
        ours = {}
        for (B, T, N) in shapes:
            for m in ms_list:
                A, b = make_inputs(B, T, N, m, grad=True)
                f = ours_fwd(A, b)
                t = record("fwd", "ours", B, T, N, m, bench(f), bytes_fwd(B, T, N, m), graph_fn=f)
                ours[("fwd", B, T, N, m)] = t
                f = ours_fwdbwd(A, b)
                t = bench(f)
                ours[("fwdbwd", B, T, N, m)] = t
                record("fwdbwd", "ours", B, T, N, m, t, bytes_fwdbwd_floor(B, T, N, m), graph_fn=f,
                       pct_of_passes=round(100 * bytes_fwdbwd_passes(B, T, N, m) / t / 1e9 / bw, 1))
                del A, b
                torch.cuda.empty_cache()
        # diagonal at the peers table's shapes
        for (B, T, N) in ([(8, 2048, 4096), (8, 16384, 4096)] if not args.quick else [(8, 2048, 4096)]):
            a = torch.rand(B, T, N, device=DEV).requires_grad_()
            x = torch.randn(B, T, N, device=DEV).requires_grad_()
            ad_, xd_ = a.detach(), x.detach()
            f = lambda: diagonal_scan(ad_, xd_)  # noqa: E731
            t = record("fwd", "ours_diag", B, T, N, 1, bench(f), B * T * N * 12, graph_fn=f)
            ours[("fwd", B, T, N, 1)] = t
            g = torch.randn_like(x)
            fb = lambda: torch.autograd.grad(diagonal_scan(a, x)[0], (a, x), g)  # noqa: E731
            tb = bench(fb)
            ours[("fwdbwd", B, T, N, 1)] = tb
            record("fwdbwd", "ours_diag", B, T, N, 1, tb, B * T * N * 24, graph_fn=fb)
            if not args.no_peers and not args.quick:
                as_scan = try_accelerated_scan()
                if as_scan is not None:
                    at = a.detach().transpose(1, 2).contiguous().requires_grad_()
                    xt = x.detach().transpose(1, 2).contiguous().requires_grad_()
                    gt = g.transpose(1, 2).contiguous()
                    atd, xtd = at.detach(), xt.detach()
                    f = lambda: as_scan(atd, xtd)  # noqa: E731
                    tp = bench(f)
                    record("fwd", "accelerated-scan", B, T, N, 1, tp, B * T * N * 12, graph_fn=f,
                           speedup_vs_peer=round(tp / t, 3))
                    tpb = None  # its backward only where it stays in its tensors (scan_peers)
                    if accelerated_scan_grad_ok(T):
                        fb = lambda: torch.autograd.grad(as_scan(at, xt), (at, xt), gt)  # noqa: E731
                        tpb = bench(fb)
                        record("fwdbwd", "accelerated-scan", B, T, N, 1, tpb, B * T * N * 24,
                               graph_fn=fb, speedup_vs_peer=round(tpb / tb, 3))
                    # ours on the peer's own (B, N, T) tensors: time_dim=2 (time_major.py)
                    f = lambda: diagonal_scan(atd, xtd, time_dim=2)  # noqa: E731
                    fb = lambda: torch.autograd.grad(diagonal_scan(at, xt, time_dim=2)[0], (at, xt), gt)  # noqa: E731
                    for kind, fn, nb, tpeer in (("fwd", f, 12, tp), ("fwdbwd", fb, 24, tpb)):
                        tt = bench(fn)
                        record(kind, "ours_diag_time_major", B, T, N, 1, tt, B * T * N * nb, graph_fn=fn,
                               peer_over_this=round(tpeer / tt, 3) if tpeer else None)
                    graph_ratio(rows, B, T, N, "ours_diag", "graph_speedup_vs_peer")
                    graph_ratio(rows, B, T, N, "ours_diag_time_major", "graph_speedup_time_major")
                if T <= 2048:
                    try:
                        f = torch.compile(assoc_scan_m1, fullgraph=True)
                        ad, xd = a.detach(), x.detach()
                        tp = bench(lambda: f(ad, xd))
                        record("fwd", "torch_assoc_scan", B, T, N, 1, tp, B * T * N * 12,
                               speedup_vs_peer=round(tp / t, 3))
                    except Exception as e:
                        log(f"torch associative_scan failed: {e!r}"[:300])
            del a, x
        if not args.no_peers and not args.quick and ("fwd", 8, 2048, 768, 1) in ours:
            B, T, N = 8, 2048, 768
            comp = torch.compile(doubling_scan)
            for m in (1, 8):
                A, b = make_inputs(B, T, N, m)
                try:
                    tp = bench(lambda: comp(A, b), warmup=2, rep=5)
                    record("fwd", "torch_doubling_compiled", B, T, N, m, tp, bytes_fwd(B, T, N, m),
                           speedup_vs_peer=round(tp / ours[("fwd", B, T, N, m)], 1))
                except Exception as e:
                    log(f"doubling m={m} failed: {e!r}"[:300])
                if m == 8:
                    t0 = time.perf_counter()
                    eager_loop(A, b)
                    torch.cuda.synchronize()
                    tp = (time.perf_counter() - t0) * 1e3
                    record("fwd", "eager_loop", B, T, N, m, tp, bytes_fwd(B, T, N, m),
                           speedup_vs_peer=round(tp / ours[("fwd", B, T, N, m)], 1))
                del A, b
    except KeyboardInterrupt:
        log("interrupted: writing the rows measured so far (partial run)")
        args.partial = True
    _write_outputs(out, args, env, bw, rows, worst, shapes, log)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _write_outputs(out, args, env, bw, rows, worst, shapes, log):
    """JSON + CSV + plot under ``out`` and a dated table appended to ``args.results``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    payload = dict(env=env, copy_tbs=bw, rows=rows, fp64_worst=worst)
    (out / f"scan_throughput_{stamp}.json").write_text(json.dumps(payload, indent=1))
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(out / f"scan_throughput_{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    try:
        if not shapes:
            raise RuntimeError("no block-size sweep in this run")
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        for j, kind in enumerate(("fwd", "fwdbwd")):
            for (B, T, N) in shapes:
                sel = [r for r in rows
                       if r["impl"] == "ours" and r["kind"] == kind and (r["B"], r["T"], r["N"]) == (B, T, N)]
                if sel:
                    line, = ax[j].plot([r["m"] for r in sel], [r["pct_copy"] for r in sel], marker="o",
                                       label=f"B{B} T{T} N{N}")
                    g = [(r["m"], r["graph_pct_copy"]) for r in sel if r.get("graph_pct_copy")]
                    if g:
                        ax[j].plot(*zip(*g), marker="x", ls="--", color=line.get_color(),
                                   label=f"B{B} T{T} N{N} (CUDA graph)")
            ax[j].set_xscale("log", base=2)
            ax[j].set_xlabel("block size m")
            ax[j].set_ylabel("% of copy bandwidth (byte floor)")
            ax[j].set_title(f"{kind}, fp32, {env['device']}")
            ax[j].axhline(100, color="gray", lw=0.5)
            ax[j].legend()
        fig.tight_layout()
        fig.savefig(out / f"scan_throughput_{stamp}.png", dpi=100)
    except Exception as e:
        log(f"plot skipped: {e!r}")
    res = Path(args.results)
    new = not res.exists()
    with open(res, "a") as f:
        if new:
            f.write("# Benchmark results\n\nRows appended by the benchmark scripts; newest last.\n")
        mode = " --lookback-compare" if getattr(args, "lookback_compare", False) else ""
        mode += " (partial: stopped by a signal)" if getattr(args, "partial", False) else ""
        f.write(f"\n## scan_throughput.py{mode}, {env['date']}\n\n{env['device']} ({env['sms']} SMs), "
                f"torch {env['torch']}, Triton {env['triton']}; copy {bw:.3f} TB/s; fp32; "
                f"fp64 check worst rel. error {worst:.1e}. TB/s = bytes(inputs once + outputs once)/median time; "
                f"fwd+bwd floor = A, b, dh read + h, dA, db written. ms = do_bench median (host "
                f"launch cost included); graph ms = do_bench_cudagraph median (GPU time only).\n\n")
        f.write("| kind | impl | B | T | N | m | ms | TB/s | % copy | graph ms | graph % copy | extra |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        main_keys = ("kind", "impl", "B", "T", "N", "m", "ms", "tbs", "pct_copy", "graph_ms", "graph_pct_copy")
        for r in rows:
            extra = {k: v for k, v in r.items() if k not in main_keys}
            f.write(f"| {r['kind']} | {r['impl']} | {r['B']} | {r['T']} | {r['N']} | {r['m']} | {r['ms']:.4f} | "
                    f"{r['tbs']:.3f} | {r['pct_copy']} | {r.get('graph_ms', '—')} | {r.get('graph_pct_copy', '—')} | "
                    f"{extra if extra else ''} |\n")
    log(f"wrote {out}/scan_throughput_{stamp}.{{json,csv,png}} and appended to {res}")


if __name__ == "__main__":
    main()
