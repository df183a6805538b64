"""Run the m = 1 forward (``diagonal_scan``, ``(B, T, N)``, fp32 or ``--dtype``) once per
``scan.TUNE`` setting, and accelerated-scan's forward on the same data in its ``(B, N, T)`` layout, for Nsight Compute:
the hardware counters say what the kernels move and how they fill the GPU (issue 3's m = 1
target: at least as fast as accelerated-scan in the same run). On the GPU machine::

    ncu --clock-control none --kernel-name regex:'_diag_fwd|forward_scan' --launch-skip 0 \\
        --section SpeedOfLight --section LaunchStats --section Occupancy \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 tools/ncu_m1.py --shape 8x2048x4096 --configs default='{}' tile='{"diag_tma": false}'

Each setting runs ``--runs`` times (the first compiles; profile them all or pass ``--launch-skip``),
for each ``--shape`` in turn (several may be given: one profile compares, e.g., B4 / B5 / B6).
``--device cpu`` is a smoke run under ``TRITON_INTERPRET=1`` (no accelerated-scan there).
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from lrnn_scan.kernels.block_diagonal import diagonal_scan  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_compare import parse_tune  # noqa: E402  (the tools' NAME=JSON / NAME=key:value+... words)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", nargs="+", default=["8x2048x4096"], help="BxTxN, one or more")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="of a, b and h (the state is fp32 in registers either way)")
    ap.add_argument("--configs", nargs="*", default=["default={}"],
                    help="NAME=JSON or NAME=key:value+key:value of TUNE overrides (tune_compare.py's words)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--no-peer", action="store_true", help="skip accelerated-scan")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    for shape in a.shape:
        if not run_shape(a, *(int(v) for v in shape.split("x"))):
            return


def run_shape(a, B: int, T: int, N: int) -> bool:
    """Every ``--configs`` setting, then accelerated-scan, on one shape; False if the peer is missing."""
    print(f"shape B{B} T{T} N{N} {a.dtype}", flush=True)
    g = torch.Generator(device=a.device).manual_seed(0)
    dtype = getattr(torch, a.dtype)
    x = (torch.rand(B, T, N, device=a.device, generator=g) * 0.5 + 0.5).to(dtype)
    y = torch.randn(B, T, N, device=a.device, generator=g).to(dtype)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    for name, tune in parse_tune(a.configs).items():
        with S.tuned(tune), torch.no_grad():
            for _ in range(a.runs):
                diagonal_scan(x, y)
                sync()
        print(f"{name} done", flush=True)
    if not a.no_peer and a.device == "cuda":
        from scan_peers import try_accelerated_scan
        peer = try_accelerated_scan()
        if peer is None:
            print("accelerated-scan not installed: skipped", flush=True)
            return False
        xt, yt = x.transpose(1, 2).contiguous(), y.transpose(1, 2).contiguous()
        with torch.no_grad():
            for _ in range(a.runs):
                peer(xt, yt)
                sync()
        print("accelerated-scan done", flush=True)
    return True


if __name__ == "__main__":
    main()
