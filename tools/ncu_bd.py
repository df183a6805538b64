"""Run the block-diagonal scan once per setting for Nsight Compute (hardware counters of each kernel:
where its cycles go). fp32, B1 T16384 N768 by default; one forward (no autograd) or forward+backward
per m, under ``scan.TUNE`` overrides given as JSON. On the GPU machine::

    ncu --clock-control none --kernel-name regex:'_bd_' --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section SchedulerStats python3 tools/ncu_bd.py --m 8 16 [--grad] \\
        [--tune '{"bd_lookback": true}']

Each m runs twice (the first compiles) and ``torch.cuda.synchronize`` separates the runs; pass
``--launch-skip`` to ncu to profile the second.
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
    ap.add_argument("--m", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--shape", default="1x16384x768", help="BxTxN")
    ap.add_argument("--grad", action="store_true", help="forward+backward")
    ap.add_argument("--tune", default="{}", help="scan.TUNE overrides as JSON")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"      # before the scan module imports triton
    from lrnn_scan.kernels.block_diagonal import scan as S
    B, T, N = (int(x) for x in a.shape.split("x"))
    for m in a.m:
        A = torch.randn(B, T, N // m, m, m, device=a.device) * (0.9 / m ** 0.5)
        b = torch.randn(B, T, N // m, m, device=a.device)
        A.requires_grad_(a.grad), b.requires_grad_(a.grad)
        with S.tuned(json.loads(a.tune)):
            for _ in range(a.runs):
                if a.grad:
                    torch.autograd.grad(S.block_diagonal_scan(A, b)[0], (A, b), torch.ones_like(b))
                else:
                    with torch.no_grad():
                        S.block_diagonal_scan(A, b)
                if a.device == "cuda":
                    torch.cuda.synchronize()
        print(f"m={m} done", flush=True)


if __name__ == "__main__":
    main()
