"""Throughput of the DeltaProduct chunkwise path (issue 4).

B=8, T=4096, H=16, K=V=128, bf16, n_h ∈ {1,2,3,4}, gated and ungated, forward and forward+backward,
medians of ``triton.testing.do_bench``. fla's ``chunk_gated_delta_product`` is timed in the same run
when importable; otherwise its H200 numbers from ``shared/reference/peers.md`` are printed as a
clearly labelled reference (not the same run, possibly not the same device).

Writes ``<out>/delta_throughput.{csv,json}`` and appends dated rows to ``benchmarks/RESULTS.md``.

    python benchmarks/delta_throughput.py [--nh 1 2 3 4] [--out benchmarks/out] [--results benchmarks/RESULTS.md]

``--variants [NAME ...]`` times ``function.TUNE`` settings against the default instead
(``VARIANTS`` in ``delta_variants.py``; all of ``DEFAULT_VARIANTS`` when no name is given) at
n_h ∈ {1, 2} (unless ``--nh``), gated and ungated, forward and forward+backward, after checking
each variant's bf16 error ratios against an fp64 reference (torch backend on the same bf16-rounded
inputs; B=2, T=1024, H=``--check-H`` 4, β ≤ 2, with initial and final states, as
tests/gpu/test_gpu_delta.py; bound 5e-3). Writes
``<out>/delta_variants.{csv,json}`` and a table in the results file. ``--dtype fp32`` runs that
mode on float32 inputs with TF32 off (error bound 1e-4, as the GPU tests'; e.g. the ``fp32_ieee``
variant, ``TUNE["fp32_dot"]``). ``--variants ... --kernels`` adds a table of each kernel's GPU
time in one fwd+bwd under each variant (``kernel_times.py``). ``--variants ... --emulate`` runs
only that error check, on the CPU (Triton interpreter with the GPU's rounding emulated, see
``delta_accuracy.emulate_gpu_rounding``; minutes per variant and configuration at the full check size).

``--fla-accuracy`` adds two columns to the fla comparison: ours and fla's worst bf16 error against
the fp64 reference on the same inputs (``delta_accuracy.py``; the check size above, no initial
state), so that a speed ratio can be read beside the accuracy each side delivers.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.delta_accuracy import (  # noqa: E402
    ERR_BOUND, bf16_case, emulate_gpu_rounding, error_vs_fp64, fla_layout)
from benchmarks.delta_variants import DEFAULT_VARIANTS, VARIANTS  # noqa: E402
from benchmarks.kernel_times import kernel_rows, kernel_times  # noqa: E402

# fla's measurements (peers.md; one H200, torch 2.11, Triton 3.6) — reference only, not this run
PEERS_FLA_H200 = {  # (n_h, gated, mode) -> ms
    (1, True, "fwd"): 1.086, (1, False, "fwd"): 1.045, (1, False, "fwd+bwd"): 3.38,
    (2, True, "fwd"): 1.937, (2, False, "fwd"): 1.845, (2, False, "fwd+bwd"): 6.58,
    (3, True, "fwd"): 2.772, (3, False, "fwd"): 2.656, (3, False, "fwd+bwd"): 9.47,
    (4, False, "fwd"): 3.451, (4, False, "fwd+bwd"): 12.36,
}
DEVICE = "cuda"         # a CPU smoke test of the script's logic sets "cpu" (interpreter)


def inputs(B, T, n_h, H, K, V, gated, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    d = DEVICE
    q = torch.randn(B, T, H, K, device=d, dtype=dtype)
    k = F.normalize(torch.randn(B, T, n_h, H, K, device=d, dtype=torch.float32), dim=-1).to(dtype)
    v = torch.randn(B, T, n_h, H, V, device=d, dtype=dtype)
    beta = (torch.rand(B, T, n_h, H, device=d) * 2).to(dtype)
    g = F.logsigmoid(torch.randn(B, T, H, device=d) + 3).to(dtype) if gated else None
    return q, k, v, beta, g


def _fla(unguarded=False):
    """fla's ``chunk_gated_delta_product``, or None. ``unguarded``: switch off fla's refusal to run
    the gated backward on Hopper with Triton 3.4-3.7.0 (its #640: that kernel's results are wrong
    there), so that its *time* can be taken; the rows say so and carry the relative difference of
    fla's gradients from ours (ours are checked against fp64 on the GPU by tests/gpu)."""
    try:
        from fla.ops.gated_delta_product import chunk_gated_delta_product  # type: ignore
        if unguarded:
            from lrnn_scan.bench.peers import fla_disable_hopper_guard
            fla_disable_hopper_guard()
        return chunk_gated_delta_product
    except Exception as e:  # noqa: BLE001
        print(f"[delta_throughput] fla not importable ({type(e).__name__}: {e}); "
              "fla rows use peers.md's H200 table as a labelled reference, not this run")
        return None


def time_fn(fn, grad_of=None, do=None):
    from triton.testing import do_bench

    if grad_of is None:
        with torch.no_grad():
            return do_bench(fn, warmup=25, rep=100, return_mode="median")

    def step():
        o = fn()
        torch.autograd.backward(o, do)
        for x in grad_of:
            x.grad = None

    return do_bench(step, warmup=25, rep=100, return_mode="median")


def _agreement(ours, theirs, grad_of=None, do=None):
    """(worst relative RMS difference, its name) between two implementations' outputs and, with
    ``grad_of``, their gradients for those tensors (None where the two have no gradient)."""
    def run(fn):
        if grad_of is None:
            with torch.no_grad():
                return [fn().float()]
        o = fn()
        gs = torch.autograd.grad(o, grad_of, do, allow_unused=True)
        return [o.detach().float()] + [None if x is None else x.float() for x in gs]

    names = ["o", "dq", "dk", "dv", "dbeta", "dg"]
    worst = (0.0, "o")
    for name, x, y in zip(names, run(ours), run(theirs)):
        if x is None or y is None:
            continue
        d = ((x - y.reshape(x.shape)).norm() / x.norm().clamp_min(1e-30)).item()
        if not d <= worst[0]:          # NaN counts as worst
            worst = (d, name)
    return worst


def profile(a, fn, fla=None):
    """Per-kernel CUDA times (torch.profiler) of one fwd+bwd per config; with ``fla``, fla's
    ``chunk_gated_delta_product`` on the same inputs right after ours, so that each of our backward
    kernels can be set beside its fla counterpart (same GPU, same run). Each table is printed and
    appended to ``<out>/delta_profile.txt`` as soon as it is taken, so a run cut short (a device
    call's time limit; a cold start compiles and fla autotunes first) keeps the tables it took."""
    from torch.profiler import ProfilerActivity, profile as prof

    log = Path(a.out) / "delta_profile.txt"
    log.parent.mkdir(parents=True, exist_ok=True)

    def one(name, call, xs, do):
        for _ in range(2):
            call().backward(do)
        for x in xs:   # else the profiled backward adds into .grad: 4-5 elementwise kernels,
            x.grad = None  # ~0.4 ms at B8 T4096 H16 that are the harness's, not the layer's
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            call().backward(do)
            torch.cuda.synchronize()
        text = (f"--- profile {name} (one fwd+bwd; B={a.B} T={a.T} H={a.H} K=V={a.K} bf16, "
                f"{torch.cuda.get_device_name()})\n"
                + p.key_averages().table(sort_by="cuda_time_total", row_limit=16) + "\n")
        print(text, flush=True)
        with open(log, "a") as f:
            f.write(text)
        for x in xs:
            x.grad = None

    for n_h in a.nh:
        for gated in [s == "1" for s in a.gated]:
            q, k, v, beta, g = inputs(a.B, a.T, n_h, a.H, a.K, a.K, gated)
            xs = [x.requires_grad_() for x in (q, k, v, beta, g) if x is not None]
            do = torch.randn_like(q)
            one(f"n_h={n_h} gated={int(gated)} ours",
                lambda: fn(q, k, v, beta, g, chunk_size=a.chunk, backend="triton")[0], xs, do)
            if fla is not None:
                kf, vf, bf = k.flatten(1, 2), v.flatten(1, 2), beta.flatten(1, 2)
                try:
                    one(f"n_h={n_h} gated={int(gated)} fla",
                        lambda: fla(q=q, k=kf, v=vf, g=g, beta=bf, num_householder=n_h)[0], xs, do)
                except Exception as e:  # noqa: BLE001
                    print(f"[delta_throughput] fla profile n_h={n_h} gated={gated} failed: {e}")


def _results_writer(res: Path, title: str, cols):
    """``record(cells)``: append one table row to the results file as soon as it is measured (a run
    cut short still leaves its rows); the section title and table header go before the first row."""
    n = [0]

    def record(cells):
        new = not res.exists()
        with open(res, "a") as fh:
            if new:
                fh.write("# Benchmark results\n\n")
            if n[0] == 0:
                fh.write(f"\n## {title}\n\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
            n[0] += 1
            fh.write("| " + " | ".join(str(c) for c in cells) + " |\n")
    return record


def accuracy_pair(a, ours_fn, fla, n_h, gated):
    """``(ours, fla)`` as ``(worst error, its name)`` against fp64 on the same bf16 inputs
    (``delta_accuracy.error_vs_fp64`` at B=2, ``--check-T``, ``--check-H``, ``K = --K``); fla's
    entry is a string when fla is absent or refuses (e.g. its gated backward on Hopper with Triton
    < 3.7.1 unless --fla-unguarded)."""
    size = dict(B=2, T=a.check_T, H=a.check_H)
    ours = error_vs_fp64(lambda *x: ours_fn(*x, chunk_size=a.chunk, backend="triton")[0],
                         n_h, gated, a.K, DEVICE, **size)[:2]
    if fla is None:
        return ours, "fla absent"
    try:
        theirs = error_vs_fp64(fla_layout(fla, n_h), n_h, gated, a.K, DEVICE, **size)[:2]
    except Exception as e:  # noqa: BLE001  (fla's own refusals are reported, not raised)
        theirs = f"fla refused: {str(e).splitlines()[0][:80]}"
    print(f"[accuracy] n_h={n_h} gated={int(gated)} ours {ours} fla {theirs}", flush=True)
    return ours, theirs


def _run_grads(fn, backend, xs, do, dh):
    xs = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
    o, f = fn(*xs[:5], initial_state=xs[5], output_final_state=True, chunk_size=64, backend=backend)
    live = [x for x in xs if x is not None]
    gr = torch.autograd.grad((o.double() * do).sum() + (f.double() * dh).sum(), live)
    return [o.detach(), f.detach()] + list(gr)


def _time_fla(fla, q, k, v, beta, g, n_h, grad_of, do):
    """fla's time on our inputs (its interleaved layout), or None where fla refuses (printed)."""
    kf, vf, bf = k.flatten(1, 2), v.flatten(1, 2), beta.flatten(1, 2)
    call = lambda: fla(q=q, k=kf, v=vf, g=g, beta=bf, num_householder=n_h)[0]  # noqa: E731
    try:            # one call first, so that fla's own refusals (e.g. in its backward) show here
        o = call()
        if grad_of is not None:
            torch.autograd.grad(o, grad_of, do)
    except Exception as e:  # noqa: BLE001  (reported, not raised)
        print(f"[delta_throughput] fla n_h={n_h} refused: {str(e).splitlines()[0][:110]}")
        return None
    return time_fn(call, grad_of, do)


FP32_BOUND = 1e-4   # the float32 error bound of tests/gpu/test_gpu_delta.py
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def run_variants(a, fn, dev):
    """Each variant's error ratios (small size; ``--dtype`` inputs, bf16 by default) first, then
    forward and forward+backward times."""
    import triton

    from lrnn_scan.kernels.delta_product import function as dpf

    names = a.variants or DEFAULT_VARIANTS
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variants {bad}; known: {list(VARIANTS)}")
    nhs = a.nh or [1, 2]
    gates = [s == "1" for s in a.gated]
    dtype = DTYPES[a.dtype]
    bound = ERR_BOUND if a.dtype == "bf16" else FP32_BOUND
    if a.dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False   # fp32 means fp32 (TUNE["fp32_dot"] decides)
    base = dict(dpf.TUNE)

    def with_tune(name, f):
        dpf.TUNE.update(VARIANTS[name])
        try:
            return f()
        finally:
            dpf.TUNE.clear()
            dpf.TUNE.update(base)

    fla = _fla(a.fla_unguarded) if a.variants_fla else None
    t_start = time.time()
    B, T, H, K = a.B, a.T, a.H, a.K
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    err = {}
    cB, cT, cH = 2, a.check_T, a.check_H
    for n_h in nhs:
        for gated in gates:
            ref_in, lo_in = bf16_case(cB, cT, n_h, cH, K, K, gated, 2.0, seed=n_h, device=DEVICE,
                                      dtype=dtype)
            gen = torch.Generator(device=DEVICE).manual_seed(9)
            do = torch.randn(cB, cT, cH, K, generator=gen, device=DEVICE, dtype=torch.float64)
            dh = torch.randn(cB, cH, K, K, generator=gen, device=DEVICE, dtype=torch.float64)
            ref = _run_grads(fn, "torch", ref_in, do, dh)
            labels = ["o", "final", "dq", "dk", "dv", "dbeta"] + (["dg"] if gated else []) + ["dh0"]
            for name in names:
                got = with_tune(name, lambda: _run_grads(fn, "triton", lo_in, do, dh))
                res = {lab: ((x.double() - y).norm() / y.norm()).item() for lab, x, y in zip(labels, got, ref)}
                worst = max(res, key=lambda k_: res[k_] if res[k_] == res[k_] else float("inf"))
                err[(name, n_h, gated)] = (res[worst], worst)
                ok = res[worst] <= bound
                print(f"[check] {name:24s} n_h={n_h} gated={int(gated)} worst {res[worst]:.3e} ({worst})"
                      f"{'' if ok else f'  FAILS the {bound} bound'} | " +
                      " ".join(f"{k_}={v_:.2e}" for k_, v_ in res.items()), flush=True)
            del ref_in, lo_in, ref
            torch.cuda.empty_cache()
    print(f"[variants] error checks done in {time.time() - t_start:.0f} s", flush=True)
    if a.emulate:
        return
    res_path = Path(a.results)
    record = _results_writer(
        res_path, f"delta_throughput.py --variants — {date} — {dev}, torch {torch.__version__}, Triton "
        f"{triton.__version__}, B={B} T={T} H={H} K=V={K} {a.dtype}, chunk {a.chunk}; error: worst {a.dtype} "
        f"ratio vs fp64 at B={cB} T={cT} H={cH}, β ≤ 2, bound {bound}",
        ["variant", "TUNE overrides", "n_h", "gated", "mode", "ms", "vs default", f"{a.dtype} error (worst)"]
        + (["vs fla (same run)"] if a.variants_fla else []))
    k_rows = []     # --kernels: written after the timing table (printed as they come)
    rows = []
    for n_h in nhs:
        for gated in gates:
            q, k, v, beta, g = inputs(B, T, n_h, H, K, K, gated, dtype=dtype)
            for mode in a.modes:
                bwd = mode == "fwd+bwd"
                xs = [x.requires_grad_(bwd) for x in (q, k, v, beta, g) if x is not None]
                do = torch.randn(B, T, H, K, device=DEVICE, dtype=q.dtype) if bwd else None
                call = lambda: fn(q, k, v, beta, g, chunk_size=a.chunk, backend="triton")[0]  # noqa: E731
                t_fla = _time_fla(fla, q, k, v, beta, g, n_h, xs if bwd else None, do) if fla else None
                if fla is not None:
                    print(f"n_h={n_h} gated={int(gated)} {mode:8s} {'fla (peer)':24s} "
                          f"{t_fla if t_fla else float('nan'):8.3f} ms", flush=True)
                t_def = None
                for name in names:
                    t = with_tune(name, lambda: time_fn(call, xs if bwd else None, do))
                    if name == "default":
                        t_def = t
                    e, which = err[(name, n_h, gated)]
                    rel = f"{t / t_def:.3f}" if t_def else "—"
                    rel_fla = f"{t / t_fla:.3f}" if t_fla else "—"
                    row = dict(date=date, device=dev, torch=torch.__version__, triton=triton.__version__,
                               B=B, T=T, H=H, K=K, V=K, n_h=n_h, gated=gated, mode=mode, chunk=a.chunk,
                               variant=name, tune=VARIANTS[name], ms=round(t, 4),
                               vs_default=round(t / t_def, 4) if t_def else None,
                               dtype=a.dtype, err=e, err_of=which, err_ok=e <= bound,
                               fla_ms=round(t_fla, 4) if t_fla else None,
                               vs_fla=round(t / t_fla, 4) if t_fla else None)
                    rows.append(row)
                    record([name, json.dumps(VARIANTS[name]) if VARIANTS[name] else "—", n_h, int(gated),
                            mode, f"{t:.3f}", rel,
                            f"{e:.2e} ({which})" + ("" if e <= bound else " **fails**")]
                           + ([rel_fla] if a.variants_fla else []))
                    print(f"n_h={n_h} gated={int(gated)} {mode:8s} {name:24s} {t:8.3f} ms  vs default {rel}"
                          + (f"  vs fla {rel_fla}" if a.variants_fla else "") + f"  err {e:.2e} ({which})",
                          flush=True)
                if bwd and a.kernels:
                    def pass_():
                        torch.autograd.grad(call(), xs, do)
                    per = {name: with_tune(name, lambda: kernel_times(pass_)) for name in names}
                    for cells in kernel_rows(per):
                        k_rows.append([n_h, int(gated)] + cells)
                        print(f"[kernels] n_h={n_h} gated={int(gated)} " + " | ".join(cells), flush=True)
                for x in xs:
                    x.requires_grad_(False)
                torch.cuda.empty_cache()
    if k_rows:
        record_k = _results_writer(
            res_path, f"delta_throughput.py --variants --kernels — {date} — {dev}, torch {torch.__version__}, "
            f"Triton {triton.__version__}, B={B} T={T} H={H} K=V={K} {a.dtype}, chunk {a.chunk}: GPU µs per "
            f"kernel of one fwd+bwd (torch.profiler, mean of 3 calls)",
            ["n_h", "gated", "kernel"] + [f"{n} (µs)" for n in names])
        for cells in k_rows:
            record_k(cells)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "delta_variants.json").write_text(json.dumps(rows, indent=1))
    with open(out / "delta_variants.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"[variants] {time.time() - t_start:.0f} s in all; wrote {out}/delta_variants.csv/json and "
          f"appended to {res_path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nh", type=int, nargs="+", default=None,
                    help="default 1 2 3 4 (1 2 with --variants)")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"])
    ap.add_argument("--gated", nargs="+", default=["0", "1"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    ap.add_argument("--fla-unguarded", action="store_true",
                    help="time fla's gated backward although fla refuses it on Hopper with Triton "
                         "< 3.7.1 (its #640: wrong results there); rows are labelled, timing only")
    ap.add_argument("--fla-accuracy", action="store_true",
                    help="also measure ours and fla's bf16 error against the fp64 reference on the "
                         "same inputs (delta_accuracy.py at B2, --check-T, --check-H, β ≤ 2; output "
                         "and every gradient)")
    ap.add_argument("--profile", action="store_true",
                    help="print per-kernel CUDA times (torch.profiler) of one fwd+bwd per config, then exit")
    ap.add_argument("--profile-fla", action="store_true",
                    help="with --profile: profile fla's chunk_gated_delta_product on the same inputs too")
    ap.add_argument("--variants", nargs="*", default=None, metavar="NAME",
                    help=f"time TUNE variants instead (no names: {' '.join(DEFAULT_VARIANTS)}; "
                    f"known: {' '.join(VARIANTS)})")
    ap.add_argument("--kernels", action="store_true",
                    help="with --variants: after each fwd+bwd timing, a table of every kernel's GPU "
                    "time (torch.profiler, mean of 3 calls) under each variant")
    ap.add_argument("--variants-fla", action="store_true",
                    help="with --variants: time fla's chunk_gated_delta_product on the same inputs in "
                    "the same run too (a 'vs fla' column; --fla-unguarded applies)")
    ap.add_argument("--check-H", type=int, default=4,
                    help="heads of the --variants and --fla-accuracy error checks (B=2)")
    ap.add_argument("--check-T", type=int, default=1024,
                    help="length of the --variants and --fla-accuracy error checks")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                    help="with --variants: the inputs' dtype (fp32: TF32 off, error bound 1e-4)")
    ap.add_argument("--emulate", action="store_true",
                    help="with --variants: the error check only, on the CPU interpreter with the GPU's "
                    "tf32/bf16 rounding emulated (no GPU needed, no timing)")
    a = ap.parse_args()
    if a.emulate:
        if a.variants is None:
            raise SystemExit("--emulate goes with --variants")
        if a.dtype != "bf16":
            raise SystemExit("--emulate emulates the GPU's bf16 / tf32 rounding: bf16 inputs only")
        global DEVICE
        DEVICE = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"          # before anything imports triton
        emulate_gpu_rounding()
        from lrnn_scan.delta import chunk_delta_product
        return run_variants(a, chunk_delta_product, "CPU interpreter, GPU rounding emulated")
    if not torch.cuda.is_available():
        print("[delta_throughput] needs CUDA; nothing timed")
        return
    import triton

    from lrnn_scan.delta import chunk_delta_product

    if a.variants is not None:
        return run_variants(a, chunk_delta_product, torch.cuda.get_device_name())
    a.nh = a.nh or [1, 2, 3, 4]
    if a.profile:
        return profile(a, chunk_delta_product, _fla(a.fla_unguarded) if a.profile_fla else None)
    fla = _fla(a.fla_unguarded)
    dev = torch.cuda.get_device_name()
    B, T, H, K = a.B, a.T, a.H, a.K
    rows = []
    fla_refused = {}            # (gated, mode) -> reason fla gave (e.g. its Hopper + Triton < 3.7.1 check)
    res = Path(a.results)
    date0 = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    write_row = _results_writer(res, f"delta_throughput.py — {date0} — {dev}, torch {torch.__version__}, "
                                f"Triton {triton.__version__}, B={B} T={T} H={H} K=V={K} bf16, chunk {a.chunk}",
                                ["n_h", "gated", "mode", "ours (ms)", "fla (ms)", "fla source", "ours/fla",
                 "fla vs ours (rel. diff, worst output/grad)"]
                                + (["ours vs fp64 (worst)", "fla vs fp64 (worst)"] if a.fla_accuracy else []))

    def err_cell(e):
        return "—" if e is None else (e if isinstance(e, str) else
                                      f"{e[0]:.2e} ({e[1]})" + ("" if e[0] <= ERR_BOUND else " > bound"))

    def record(r):
        write_row([r["n_h"], int(r["gated"]), r["mode"], f"{r['ours_ms']:.3f}",
                   f"{r['fla_ms']:.3f}" if r["fla_ms"] else "—", r["fla_source"], r["ratio"] if r["ratio"] else "—",
                   f"{r['fla_vs_ours']:.2e} ({r['fla_vs_ours_worst']})" if r.get("fla_vs_ours") is not None else "—"]
                  + ([err_cell(r["ours_err"]), err_cell(r["fla_err"])] if a.fla_accuracy else []))
    for n_h in a.nh:
        for gated in [s == "1" for s in a.gated]:
            acc = accuracy_pair(a, chunk_delta_product, fla, n_h, gated) if a.fla_accuracy else (None, None)
            q, k, v, beta, g = inputs(B, T, n_h, H, K, K, gated)
            for mode in a.modes:
                bwd = mode == "fwd+bwd"
                xs = [x.requires_grad_(bwd) for x in (q, k, v, beta, g) if x is not None]
                ours = lambda: chunk_delta_product(q, k, v, beta, g, chunk_size=a.chunk, backend="triton")[0]
                do = torch.randn(B, T, H, K, device=DEVICE, dtype=q.dtype) if bwd else None
                t_ours = time_fn(ours, xs if bwd else None, do)
                t_fla, src, agree = None, "peers.md H200 (reference, not this run)", None
                if fla is not None and (gated, mode) in fla_refused:
                    src = f"fla refused in this run: {fla_refused[(gated, mode)]}"
                elif fla is not None:
                    kf = k.flatten(1, 2)
                    vf = v.flatten(1, 2)
                    bf = beta.flatten(1, 2)
                    # ungated: g=None, fla's own ungated path (a zero gate would run the gated one,
                    # whose backward fla refuses on Hopper with Triton < 3.7.1)
                    f_call = lambda: fla(q=q, k=kf, v=vf, g=g, beta=bf, num_householder=n_h)[0]
                    try:
                        agree = _agreement(ours, f_call, xs if bwd else None, do)
                        t_fla = time_fn(f_call, xs if bwd else None, do)
                        src = "fla, same run"
                        if a.fla_unguarded and gated and bwd:
                            src += " (fla's Hopper guard off: #640, timing only)"
                    except Exception as e:  # noqa: BLE001
                        print(f"[delta_throughput] fla n_h={n_h} gated={gated} {mode} failed: {e}")
                        fla_refused[(gated, mode)] = str(e).splitlines()[0][:110]
                        src = f"fla refused in this run: {fla_refused[(gated, mode)]}"
                if t_fla is None:
                    t_fla = PEERS_FLA_H200.get((n_h, gated, mode))
                    if t_fla is not None and not src.startswith("peers.md"):
                        src += "; ratio vs peers.md H200 (reference, not this run)"
                ratio = (t_ours / t_fla) if t_fla else None
                row = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           device=dev, torch=torch.__version__, triton=triton.__version__,
                           B=B, T=T, H=H, K=K, V=K, n_h=n_h, gated=gated, mode=mode, chunk=a.chunk,
                           ours_ms=round(t_ours, 4), fla_ms=t_fla, fla_source=src,
                           ratio=round(ratio, 3) if ratio else None,
                           fla_vs_ours=agree[0] if agree else None,
                           fla_vs_ours_worst=agree[1] if agree else None,
                           ours_err=acc[0], fla_err=acc[1])
                rows.append(row)
                record(row)
                print(f"n_h={n_h} gated={int(gated)} {mode:8s} ours {t_ours:8.3f} ms | fla "
                      f"{t_fla if t_fla else float('nan'):7.3f} ms ({src}) | ratio "
                      f"{ratio if ratio else float('nan'):.3f}", flush=True)
                for x in xs:
                    x.requires_grad_(False)
                torch.cuda.empty_cache()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "delta_throughput.json").write_text(json.dumps(rows, indent=1))
    with open(out / "delta_throughput.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"[delta_throughput] wrote {out}/delta_throughput.csv/json and appended to {res}")


if __name__ == "__main__":
    main()
