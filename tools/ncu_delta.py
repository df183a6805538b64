"""Run the delta-product fwd+bwd a few times for Nsight Compute (hardware counters of each backward
kernel: where its cycles go). bf16, B8 T4096 H16 K=V=128 by default, under ``function.TUNE``
overrides given as JSON. On the GPU machine::

    ncu --clock-control none --kernel-name regex:'state_bwd_fused|dqkwg_bwd|wy_bwd_vn' \\
        --launch-skip 3 --launch-count 3 --section SpeedOfLight --section WarpStateStats \\
        python3 tools/ncu_delta.py --nh 2 [--gated] [--tune '{"dqkwg": [4, 2, 32]}']

The first run compiles; ``torch.cuda.synchronize`` separates the runs, so ``--launch-skip`` (the
number of matching kernels of one run) profiles the second. ``--device cpu`` is a smoke run in
Triton's interpreter (the script sets ``TRITON_INTERPRET=1``) at a small shape (``--shape``).
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--nh", type=int, default=2)
    ap.add_argument("--gated", action="store_true")
    ap.add_argument("--shape", default="8x4096x16x128x128", help="BxTxHxKxV")
    ap.add_argument("--tune", default="{}", help="function.TUNE overrides as JSON")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"      # before the kernels' modules import triton
    from benchmarks import delta_throughput as bench
    from lrnn_scan.delta import chunk_delta_product
    from lrnn_scan.kernels.delta_product import function as fn

    bench.DEVICE = a.device
    B, T, H, K, V = (int(x) for x in a.shape.split("x"))
    q, k, v, beta, g = bench.inputs(B, T, a.nh, H, K, V, a.gated,
                                    dtype=torch.bfloat16 if a.device == "cuda" else torch.float32)
    xs = [x.requires_grad_() for x in (q, k, v, beta) + ((g,) if a.gated else ())]
    tune = json.loads(a.tune)
    for key in tune:
        if key not in fn.TUNE:
            raise SystemExit(f"unknown TUNE key {key!r}")
    saved = dict(fn.TUNE)      # restored after the runs (main() is also called from the tests)
    # JSON lists become the tuples TUNE's launch settings are
    fn.TUNE.update({key: tuple(val) if isinstance(val, list) else val for key, val in tune.items()})
    try:
        for _ in range(a.runs):
            o = chunk_delta_product(q, k, v, beta, g if a.gated else None, backend="triton")[0]
            torch.autograd.grad(o, xs, torch.ones_like(o))
            if a.device == "cuda":
                torch.cuda.synchronize()
    finally:
        fn.TUNE.update(saved)
    print(f"n_h={a.nh} gated={a.gated} done", flush=True)


if __name__ == "__main__":
    main()
