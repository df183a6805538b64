"""Run the time-contiguous m = 1 scan (``diagonal_scan(..., time_dim=2)``, ``time_major.py``) forward
and backward on ``(B, N, T)`` fp32 tensors, twice per ``T``, for Nsight Compute (the thirty-eighth
session's look at the backward at ``T % 16 != 0``). On the GPU machine::

    ncu --clock-control none --kernel-name regex:'_tm_bwd|_tm_fwd' --launch-skip 2 \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum \\
        python3 tools/ncu_tm.py --T 4096 4104

``--device cpu`` is a smoke run under ``TRITON_INTERPRET=1`` (use a small ``--B`` / ``--N``).
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.kernels.block_diagonal import diagonal_scan  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[4096, 4104])
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    for T in a.T:
        g = torch.Generator(device=a.device).manual_seed(0)
        x = (torch.rand(a.B, a.N, T, device=a.device, generator=g) * 0.5 + 0.5).requires_grad_()
        y = torch.randn(a.B, a.N, T, device=a.device, generator=g).requires_grad_()
        dh = torch.randn(a.B, a.N, T, device=a.device, generator=g)
        for _ in range(a.runs):
            diagonal_scan(x, y, time_dim=2)[0].backward(dh)
            if a.device == "cuda":
                torch.cuda.synchronize()
        print(f"T {T} done", flush=True)


if __name__ == "__main__":
    main()
