"""Host (Python + launch) cost of one scan call against its GPU time, fp32, B8 T2048 N768.

For each case: ``loop`` = wall time per call of n back-to-back calls with one synchronize at the
end (max of host and GPU time per call), ``graph`` = CUDA-graph replay (GPU time only), and the
host time per call with the GPU work made negligible (T = 16, same launches). With ``--profile``
it prints cProfile's top functions (tottime) of the m = 1 forward+backward, to find what the host
spends its time on.

    python tools/host_overhead.py [--m 1 2 4] [--profile]
"""
import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.bench.measure import graph_time  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402


def _case(B, T, N, m, grad):
    H = N // m
    A = (torch.randn(B, T, H, m, m, device="cuda") * (0.9 / m ** 0.5)).requires_grad_(grad)
    b = torch.randn(B, T, H, m, device="cuda").requires_grad_(grad)
    g = torch.randn_like(b)
    if m == 1:
        a1, b1, g1 = A.detach().view(B, T, H).requires_grad_(grad), b.detach().view(B, T, H).requires_grad_(grad), g.view(B, T, H)
        if grad:
            return lambda: torch.autograd.grad(S.diagonal_scan(a1, b1)[0], (a1, b1), g1)
        return lambda: S.diagonal_scan(a1, b1)
    if grad:
        return lambda: torch.autograd.grad(S.block_diagonal_scan(A, b)[0], (A, b), g)
    return lambda: S.block_diagonal_scan(A, b)


def _loop_us(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}")
    print("| m | mode | loop us/call (T2048) | graph us (T2048) | host us/call (T16) |\n|---|---|---|---|---|")
    for m in a.m:
        for grad in (False, True):
            fn = _case(8, 2048, 768, m, grad)
            loop = _loop_us(fn)
            graph = graph_time(fn, rep=50) * 1e3
            host = _loop_us(_case(8, 16, 768, m, grad))
            print(f"| {m} | {'fwd+bwd' if grad else 'fwd'} | {loop:.1f} | {graph:.1f} | {host:.1f} |", flush=True)
    if a.profile:
        fn = _case(8, 16, 768, 1, True)
        _loop_us(fn, 20)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
