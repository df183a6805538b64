"""Host (Python + launch) cost of one scan call against its GPU time, fp32, B8 T2048 N768
(``--shape``).

For each case: ``loop`` = wall time per call of n back-to-back calls with one synchronize at the
end (max of host and GPU time per call), ``graph`` = CUDA-graph replay (GPU time only), the
host time per call with the GPU work made negligible (T = 16, same launches) and ``issue`` = the
host time per call at the shape itself (n calls timed without a synchronize: the host's side of
the plan that shape gets; an upper bound: where the GPU is the slower side, a full launch queue
makes the host wait). ``--bdlru METHOD`` times ``bdlru_scan(logits, v, method=METHOD)``
(``(B, T, N/m, m, m + 1)`` softmax logits) instead of ``block_diagonal_scan``. With
``--profile`` it prints cProfile's top functions (tottime) of the first ``--m``'s
forward+backward at the shape, to find what the host spends its time on.

    python tools/host_overhead.py [--m 1 2 4] [--shape 1x4096x768] [--bdlru unfused] [--profile]
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
from lrnn_scan.gated import bdlru_scan  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402


def _case(B, T, N, m, grad, bdlru=None):
    H = N // m
    if bdlru:
        z = torch.randn(B, T, H, m, m + 1, device="cuda").requires_grad_(grad)
        v = torch.randn(B, T, H, m, device="cuda").requires_grad_(grad)
        dh = torch.randn_like(v)
        if grad:
            return lambda: torch.autograd.grad(bdlru_scan(z, v, method=bdlru), (z, v), dh)
        return lambda: bdlru_scan(z, v, method=bdlru)
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


def _issue_us(fn, n=50):
    """Host time per call: ``n`` calls without a synchronize (launches are asynchronous)."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--shape", default="8x2048x768", help="BxTxN")
    ap.add_argument("--bdlru", choices=("kernel", "unfused", "auto"), default=None,
                    help="time bdlru_scan with this method")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    B, T, N = (int(x) for x in a.shape.split("x"))
    what = f"bdlru_scan(method={a.bdlru!r})" if a.bdlru else "block_diagonal_scan"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          f"{what}, B{B} T{T} N{N} fp32")
    print(f"| m | mode | loop us/call (T{T}) | graph us (T{T}) | host us/call (T16) "
          f"| issue us/call (T{T}) |\n|---|---|---|---|---|---|")
    for m in a.m:
        for grad in (False, True):
            fn = _case(B, T, N, m, grad, a.bdlru)
            loop = _loop_us(fn)
            graph = graph_time(fn, rep=50) * 1e3
            issue = _issue_us(fn)
            host = _loop_us(_case(B, 16, N, m, grad, a.bdlru))
            print(f"| {m} | {'fwd+bwd' if grad else 'fwd'} | {loop:.1f} | {graph:.1f} | {host:.1f} "
                  f"| {issue:.1f} |", flush=True)
    if a.profile:
        fn = _case(B, T, N, a.m[0], True, a.bdlru)
        _loop_us(fn, 20)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(30 if T > 256 else 300):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
