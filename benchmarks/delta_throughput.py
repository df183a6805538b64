"""Throughput of the DeltaProduct chunkwise path (issue 4).

B=8, T=4096, H=16, K=V=128, bf16, n_h ∈ {1,2,3,4}, gated and ungated, forward and forward+backward,
medians of ``triton.testing.do_bench``. fla's ``chunk_gated_delta_product`` is timed in the same run
when importable; otherwise its H200 numbers from ``shared/reference/peers.md`` are printed as a
clearly labelled reference (not the same run, possibly not the same device).

Writes ``<out>/delta_throughput.{csv,json}`` and appends dated rows to ``benchmarks/RESULTS.md``.

    python benchmarks/delta_throughput.py [--nh 1 2 3 4] [--out benchmarks/out] [--results benchmarks/RESULTS.md]

``--variants [NAME ...]`` times ``function.TUNE`` settings against the default instead (``VARIANTS`` below;
all of ``DEFAULT_VARIANTS`` when no name is given) at n_h ∈ {1, 2} (unless ``--nh``), gated and
ungated, forward and forward+backward, after checking each variant's bf16 error ratios against an fp64
reference (torch backend on the same bf16-rounded inputs; B=2, T=1024, H=``--check-H`` 4, β ≤ 2,
with initial and final states, as tests/gpu/test_gpu_delta.py; bound 5e-3). Writes
``<out>/delta_variants.{csv,json}`` and a table in the results file. ``--variants ... --emulate`` runs
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

# fla's measurements (peers.md; one H200, torch 2.11, Triton 3.6) — reference only, not this run
PEERS_FLA_H200 = {  # (n_h, gated, mode) -> ms
    (1, True, "fwd"): 1.086, (1, False, "fwd"): 1.045, (1, False, "fwd+bwd"): 3.38,
    (2, True, "fwd"): 1.937, (2, False, "fwd"): 1.845, (2, False, "fwd+bwd"): 6.58,
    (3, True, "fwd"): 2.772, (3, False, "fwd"): 2.656, (3, False, "fwd+bwd"): 9.47,
    (4, False, "fwd"): 3.451, (4, False, "fwd+bwd"): 12.36,
}


# settings of lrnn_scan.kernels.delta_product.function.TUNE (TUNING.md "Fused W/U"), each a set
# of overrides; the combinations compile nothing beyond their parts
VARIANTS = {
    "default": {},                                   # fuse_wu "assoc" + inv_batched (H100 2026-11-24),
                                                     # save_states (H100 2026-11-25)
    "stored_wu": {"fuse_wu": False, "inv_batched": False},  # the default until 2026-11-24
    "fuse_wu": {"fuse_wu": "wu"},
    "fuse_assoc": {"fuse_wu": "assoc"},
    "inv_batched": {"inv_batched": True},
    "fuse_wu+inv_batched": {"fuse_wu": "wu", "inv_batched": True},
    "fuse_assoc+inv_batched": {"fuse_wu": "assoc", "inv_batched": True},
    # launch settings of the fused state kernels (more registers live: A, K, W); by name only
    "fuse_wu_8w": {"fuse_wu": "wu", "state_fused": (8, 2, 64), "state_bwd_fused": (8, 2, 64)},
    "fuse_assoc_8w": {"fuse_wu": "assoc", "state_fused": (8, 2, 64), "state_bwd_fused": (8, 2, 64)},
    "fuse_wu_bv32": {"fuse_wu": "wu", "state_fused": (4, 3, 32), "state_bwd_fused": (4, 3, 32)},
    # A stored in float16 (new pointer dtype: recompiles tri_inv64, wu_fwd, wy_bwd, the state kernels)
    "a_16bit": {"a_16bit": True},
    "fuse_wu+a_16bit": {"fuse_wu": "wu", "a_16bit": True},
    "fuse_assoc+a_16bit": {"fuse_wu": "assoc", "a_16bit": True},
    # the backward reuses the forward's chunk-start states and Vn (no state recompute; more memory;
    # the default since 2026-11-25); recompute_states = the default before
    "save_states": {"save_states": True},
    "recompute_states": {"save_states": False},
    "save_states+a_16bit": {"save_states": True, "a_16bit": True},
    # dqkwg_bwd split over K (partial dG summed): fewer accumulators per program, dO Vn^T per slice
    "dqkwg_k2": {"dqkwg_ksplit": 2},
    "dqkwg_k2_4w": {"dqkwg_ksplit": 2, "dqkwg": (4, 3, 32)},
    "dqkwg_4w": {"dqkwg": (4, 3, 32)},
    # forward launch settings (issue 4: the gated forward was 1.19x fla's on an H100, 2026-11-25;
    # the profile: state_fwd_fused 0.50 / 0.65 ms ungated / gated, output_fwd 0.53 / 0.55, tri_inv64
    # 0.25 / 0.29): more programs (BV 32), other pipelining depths, 8 warps
    "state_bv32": {"state_fused": (4, 3, 32)},
    "state_ns2": {"state_fused": (4, 2, 64)},
    "state_ns4": {"state_fused": (4, 4, 64)},
    "state_8w": {"state_fused": (8, 3, 64)},
    "output_ns2": {"output": (4, 2, 64)},
    "output_bv32": {"output": (4, 3, 32)},
    "output_8w_bv128": {"output": (8, 2, 128)},
    # tri_inv64 with 2 / 4 warps: with 1 it spills ~1.1 KB per thread on sm_90a, with 2 none ungated
    # (56 B gated); 2 warps were 1.6x slower on an H200 before the batched inverse (TUNE comment);
    # with it, 2 warps: fwd 1.03-1.04x on an H100 (2026-11-25, seventh session)
    "inv_2w": {"inv": (2, 1)},
    "inv_4w": {"inv": (4, 1)},
    # wy_bwd's key side in K slices (wy_bwd.py KS). sm_90a, RAW, K=128, ungated / gated spill bytes,
    # shared memory: default (8 warps) 44 / 112 B, 160 KiB (one CTA per SM); 4 slices 0 / 84 B,
    # 72 KiB; 4 slices at 4 warps 44 / 72 B, 72 KiB, 255 registers: two CTAs per SM
    "wy_bwd_k2": {"wy_bwd_ksplit": 2},
    "wy_bwd_k4_8w": {"wy_bwd_ksplit": 4, "wy_bwd": (8, 1, 64)},   # 1.03x the unsplit 8-warp time
    "wy_bwd_k4_4w": {"wy_bwd_ksplit": 4, "wy_bwd": (4, 1, 64)},   # the default since 2026-11-25 (7th)
    "wy_bwd_k1": {"wy_bwd_ksplit": 1, "wy_bwd": (8, 1, 64)},       # the default before: 1.10-1.11x
    # the "assoc" backward state kernel (state_fused.py LEAN). sm_90a spills per thread (ptxas,
    # K=V=128, 4 warps), ungated / gated: first order (3 stages) 524 / 830 bytes, lean 520 / 504,
    # lean with 1 stage 288 / 136 (the default since 2026-11-25, seventh session: H100 fwd+bwd
    # 0.871-0.909x bwd_first at n_h 1-2; bwd_first_ns1 0.905-0.985x, bwd_lean_ns3 0.928-0.966x)
    "bwd_first": {"state_bwd_lean": False, "state_bwd_fused": (4, 3, 64)},
    "bwd_first_ns1": {"state_bwd_lean": False},
    "bwd_lean_ns3": {"state_bwd_fused": (4, 3, 64)},
    # the forward without gradients before 2026-11-26: one state per 64 sub-steps and fp32 Vn
    # (the defaults now keep one state per 64 tokens at n_h > 1 and Vn in bf16 there). These change
    # the "fwd" rows only: fwd+bwd keeps every chunk's state and an fp32 Vn for the backward
    "per_chunk_fp32vn": {"token_chunk_output": False, "vn_16bit": False},
    "per_chunk": {"token_chunk_output": False},
    "fp32vn": {"vn_16bit": False},
    # Vn in bf16 for the backward too (dk error 4.78e-3 on 2026-11-24, close to the 5e-3 bound)
    "vn16_always": {"vn_16bit": True},
    # the backward's dH chunk states in bf16 (fla keeps them in the inputs' dtype): 268 MB less
    # written by the state kernel and read by dqkwg_bwd at n_h = 1, B8 T4096 H16 K=V=128
    "dhs16": {"dhs_16bit": True},
    # the lean backward state step reloads its key tile (sm_90a spills 288 -> 156 B ungated,
    # 136 -> 24 gated at n_h = 1)
    "bwd_reload_k": {"state_bwd_reload_k": True},
    "bwd_reload_k_dhs16": {"state_bwd_reload_k": True, "dhs_16bit": True},
    # the output kernels' Q H on the stored bf16 tiles (registers 168 -> ~96, smem 80 -> 64 KiB)
    "out_raw_h": {"output_raw_h": True},
    # the sliced wy_bwd stores dbeta, dg before its second pass (spills 44 -> 0 / 72 -> 24 B);
    # the token-chunk state store predicated (ungated spills 696 -> 152 B; the "fwd" rows)
    "wy_early_db": {"wy_bwd_early_db": True},
    "tok_pred": {"token_state_pred": True},
    # the ninth session (2026-11-26) changed these defaults: the eighth session's settings
    # together (s8_default) and one at a time, and the key reload with the gate too
    "s8_default": {"output_raw_h": False, "token_state_pred": False, "state_bwd_reload_k": False,
                   "dqkwg_dg_grads": False},
    "no_raw_h": {"output_raw_h": False},
    "tok_branch": {"token_state_pred": False},
    "no_reload_k": {"state_bwd_reload_k": False},
    "reload_k_always": {"state_bwd_reload_k": True},
    # the gated dqkwg_bwd's gate term as rowsum(Q dQ) - rowsum(K dK) (no second Q K^T, no [64, 64]
    # row and column sums; default since 2026-11-26), and the Z form before it; gated fwd+bwd only
    "dg_grads": {"dqkwg_dg_grads": True},
    "dg_z": {"dqkwg_dg_grads": False},
    # register caps (TUNE["maxnreg"]): tri_inv64 at 255 registers runs 8 one-warp programs an SM,
    # wy_bwd 2 four-warp ones; capped, more fit (16 / 21 at 128 / 96; wy_bwd 3 at 168), at the
    # cost of spills (sm_90a: tri_inv64 1048 -> 3204 / 3872 B a thread, wy_bwd 32 -> 296 / 628)
    "inv_r128": {"maxnreg": {"inv": 128}},
    "inv_r96": {"maxnreg": {"inv": 96}},
    "wy_bwd_r168": {"maxnreg": {"wy_bwd": 168}},
    # the token-chunk output kernel capped at 160 registers: gated 195 -> 160 without spills
    # (sm_90a), 3 programs an SM instead of 2; the default since 2026-12-03 (H200 gated fwd 0.949x /
    # 0.950x at n_h 2 / 4). out_nocap: no cap anywhere, the default before
    "out_r160": {"maxnreg": {"output_tok": 160}},
    "out_nocap": {"maxnreg": {}},
    "out_r168": {"maxnreg": {"output_tok": 168}},
    "wy_bwd_r128": {"maxnreg": {"wy_bwd": 128}},
    # twelfth session: the token-chunk output kernel in a forward with gradients (per-chunk states,
    # dense query rows, n_h times fewer state tiles read; n_h > 1 only), and dqkwg_bwd's dO H^T on
    # the bf16 tiles as stored
    "tok_out_grad": {"token_chunk_output_grad": True},
    "dqkwg_raw_h": {"dqkwg_raw_h": True},
    "tok_out_raw_h": {"token_chunk_output_grad": True, "dqkwg_raw_h": True},
    "s11_default": {"token_chunk_output_grad": False, "dqkwg_raw_h": False},
    # thirteenth session: every 16-bit storage opt-in at once (A in fp16, Vn and the backward's dH
    # in bf16; the recurrences stay fp32 in registers) -- the nearest this code gets to fla's 16-bit
    # intermediates without changing a kernel: how much of the fwd+bwd gap to fla is storage?
    "all16": {"a_16bit": True, "vn_16bit": True, "dhs_16bit": True},
}
# (inv_kslice, tri_inv64's Gram blocks summed over key slices, lost on an H200 on 2026-11-26 at
# every n_h, 1 to 4 warps: fwd 1.03-1.71x, fwd+bwd 1.00-1.14x; removed, TUNING.md)
# (dqkwg_o1_dqh and state_small, 0.871x gated fwd+bwd on an H100 on 2026-11-25, are the kernels now)
DEFAULT_VARIANTS = ["default", "per_chunk_fp32vn", "per_chunk", "fp32vn"]
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


def run_variants(a, fn, dev):
    """Each variant's bf16 error ratios (small size) first, then forward and forward+backward times."""
    import triton

    from lrnn_scan.kernels.delta_product import function as dpf

    names = a.variants or DEFAULT_VARIANTS
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variants {bad}; known: {list(VARIANTS)}")
    nhs = a.nh or [1, 2]
    gates = [s == "1" for s in a.gated]
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
            ref_in, lo_in = bf16_case(cB, cT, n_h, cH, K, K, gated, 2.0, seed=n_h, device=DEVICE)
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
                ok = res[worst] <= ERR_BOUND
                print(f"[check] {name:24s} n_h={n_h} gated={int(gated)} worst {res[worst]:.3e} ({worst})"
                      f"{'' if ok else '  FAILS the 5e-3 bound'} | " +
                      " ".join(f"{k_}={v_:.2e}" for k_, v_ in res.items()), flush=True)
            del ref_in, lo_in, ref
            torch.cuda.empty_cache()
    print(f"[variants] error checks done in {time.time() - t_start:.0f} s", flush=True)
    if a.emulate:
        return
    res_path = Path(a.results)
    record = _results_writer(
        res_path, f"delta_throughput.py --variants — {date} — {dev}, torch {torch.__version__}, Triton "
        f"{triton.__version__}, B={B} T={T} H={H} K=V={K} bf16, chunk {a.chunk}; error: worst bf16 ratio "
        f"vs fp64 at B={cB} T={cT} H={cH}, β ≤ 2, bound {ERR_BOUND}",
        ["variant", "TUNE overrides", "n_h", "gated", "mode", "ms", "vs default", "bf16 error (worst)"]
        + (["vs fla (same run)"] if a.variants_fla else []))
    rows = []
    for n_h in nhs:
        for gated in gates:
            q, k, v, beta, g = inputs(B, T, n_h, H, K, K, gated)
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
                               err=e, err_of=which, err_ok=e <= ERR_BOUND,
                               fla_ms=round(t_fla, 4) if t_fla else None,
                               vs_fla=round(t / t_fla, 4) if t_fla else None)
                    rows.append(row)
                    record([name, json.dumps(VARIANTS[name]) if VARIANTS[name] else "—", n_h, int(gated),
                            mode, f"{t:.3f}", rel,
                            f"{e:.2e} ({which})" + ("" if e <= ERR_BOUND else " **fails**")]
                           + ([rel_fla] if a.variants_fla else []))
                    print(f"n_h={n_h} gated={int(gated)} {mode:8s} {name:24s} {t:8.3f} ms  vs default {rel}"
                          + (f"  vs fla {rel_fla}" if a.variants_fla else "") + f"  err {e:.2e} ({which})",
                          flush=True)
                for x in xs:
                    x.requires_grad_(False)
                torch.cuda.empty_cache()
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
    ap.add_argument("--variants-fla", action="store_true",
                    help="with --variants: time fla's chunk_gated_delta_product on the same inputs in "
                    "the same run too (a 'vs fla' column; --fla-unguarded applies)")
    ap.add_argument("--check-H", type=int, default=4,
                    help="heads of the --variants and --fla-accuracy error checks (B=2)")
    ap.add_argument("--check-T", type=int, default=1024,
                    help="length of the --variants and --fla-accuracy error checks")
    ap.add_argument("--emulate", action="store_true",
                    help="with --variants: the error check only, on the CPU interpreter with the GPU's "
                    "tf32/bf16 rounding emulated (no GPU needed, no timing)")
    a = ap.parse_args()
    if a.emulate:
        if a.variants is None:
            raise SystemExit("--emulate goes with --variants")
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
