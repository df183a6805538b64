"""16-bit inputs of the fused-gate and companion scans: read as-is, or as an fp32 copy.

The BD-LRU layer under bf16 autocast spent 1.12 ms in the fused-gate forward and 1.44 ms in its
backward (B=8, T=2048, 192 blocks of m=4), against 0.34 / 0.46 ms for the same kernels on fp32
inputs. Hypothesis: 2-byte loads cannot become async copies (4, 8 or 16 bytes), so Triton does
not software-pipeline them and each sequential step waits for its loads. This script times, in
one run, fp32 inputs, 16-bit inputs read as-is (``TUNE["upcast16"] = False``) and 16-bit inputs
upcast to an fp32 copy first (the default), forward and forward+backward, and checks every
16-bit variant against the fp64 reference (relative RMS error of ``h`` and of every gradient).

    python benchmarks/sixteen_bit_loads.py [--results benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lrnn_scan.kernels import companion as comp_mod  # noqa: E402
from lrnn_scan.kernels import fused_gates as fg_mod  # noqa: E402
from lrnn_scan.kernels.companion.function import TUNE as COMP_TUNE  # noqa: E402
from lrnn_scan.kernels.fused_gates.function import TUNE as FG_TUNE  # noqa: E402
from lrnn_scan.testing import rel_err  # noqa: E402

CASES = [  # (family, B, T, blocks or channels, m)
    ("fused", 8, 2048, 192, 4),
    ("fused", 8, 2048, 96, 8),
    ("companion", 8, 2048, 768, 4),
]


def inputs(family, B, T, H, m, dtype, dev):
    g = torch.Generator(device="cpu").manual_seed(0)
    if family == "fused":
        z = torch.randn(B, T, H, m, m + 1, generator=g)
        v = torch.randn(B, T, H, m, generator=g)
    else:
        z = torch.randn(B, T, H, m + 1, generator=g)
        v = torch.randn(B, T, H, generator=g)
    return z.to(dev, dtype), v.to(dev, dtype)


def scan(family, z, v):
    if family == "fused":
        return fg_mod.fused_gate_scan(z, v, "softmax")[0]
    return comp_mod.companion_scan(z, v, "softmax")[0]


def reference(family, z, v, dh):
    """fp64 ``(h, dz, dv)`` of the kernels' torch reference (a loop) on ``z``, ``v`` as given."""
    z64, v64 = (t.detach().double().requires_grad_(True) for t in (z, v))
    ref = fg_mod.fused_gate_scan_ref if family == "fused" else comp_mod.companion_scan_ref
    h64 = ref(z64, v64, "softmax", 1e-6, None, False, None, dtype=torch.float64)[0]
    return (h64, *torch.autograd.grad(h64, (z64, v64), dh.double()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("[sixteen_bit_loads] needs CUDA; nothing timed")
        return
    import triton
    from triton.testing import do_bench
    dev = torch.device("cuda")
    rows = []
    for family, B, T, H, m in CASES:
        tune = FG_TUNE if family == "fused" else COMP_TUNE
        z64, v64 = inputs(family, B, T, H, m, torch.float64, dev)
        dh = torch.randn(z64.shape[:-2] + (m,) if family == "fused" else v64.shape,
                         device=dev, dtype=torch.float64)
        for dtype, upcast in ((torch.float32, True), (torch.bfloat16, False),
                              (torch.bfloat16, True)):
            tune["upcast16"] = upcast
            z, v = (t.detach().to(dtype).requires_grad_(True) for t in (z64, v64))
            dhd = dh.to(dtype)
            h64, dz64, dv64 = reference(family, z, v, dhd)     # fp64, on the rounded inputs
            h = scan(family, z, v)
            dz, dv = torch.autograd.grad(h, (z, v), dhd)
            errs = [rel_err(x.double(), ref) for x, ref in ((h, h64), (dz, dz64), (dv, dv64))]

            def fwd():
                with torch.no_grad():
                    scan(family, z, v)

            def fwdbwd():
                torch.autograd.grad(scan(family, z, v), (z, v), dhd)
            t_f = do_bench(fwd, warmup=10, rep=60, return_mode="median")
            t_fb = do_bench(fwdbwd, warmup=10, rep=60, return_mode="median")
            name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
            how = "fp32 inputs" if dtype == torch.float32 else (
                "bf16, upcast to an fp32 copy" if upcast else "bf16 read as-is")
            rows.append((family, B, T, H, m, how, t_f, t_fb, max(errs)))
            print(f"{family:9s} B{B} T{T} H{H} m{m} {how:30s} fwd {t_f:7.4f} ms fwd+bwd "
                  f"{t_fb:7.4f} ms max rel-RMS err {max(errs):.2e}", flush=True)
        tune.pop("upcast16", None)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## sixteen_bit_loads.py — {now} — {torch.cuda.get_device_name()}, torch "
             f"{torch.__version__}, Triton {triton.__version__}; softmax gates, do_bench medians\n",
             "| scan | B | T | blocks/channels | m | inputs | fwd (ms) | fwd+bwd (ms) | "
             "max rel-RMS err vs fp64 on the same rounded inputs (h, dz, dv) |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {f} | {B} | {T} | {H} | {m} | {how} | {tf:.4f} | {tfb:.4f} | {e:.2e} |"
              for f, B, T, H, m, how, tf, tfb, e in rows]
    with open(a.results, "a") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
