"""The block-diagonal forward (``--backward``: and backward) under ``compute-sanitizer --tool
memcheck``: B1 T16384 N768 by default (the time-chunked path), m = 2, 4, 8, with and without an
initial state. With ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` every tensor is its own ``cudaMalloc``, so
any read or write outside a tensor is reported, whatever lies next to it in the process's memory.
2026-11-25 (H100, Triton 3.6): forward, 0 errors (kernels/block_diagonal/README.md)::

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python tools/memcheck_block_diagonal.py [--backward] [--m 2 4 8] [--shape 1x16384x768]
"""
from __future__ import annotations

import argparse
import json

import torch

from lrnn_scan.kernels.block_diagonal import scan as S


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--shape", default="1x16384x768", help="BxTxN")
    ap.add_argument("--backward", action="store_true")
    a = ap.parse_args()
    B, T, N = (int(x) for x in a.shape.split("x"))
    torch.manual_seed(0)
    for m in a.m:
        H = N // m
        A = torch.rand(B, T, H, m, m, device="cuda")
        A = A / A.sum(-1, keepdim=True) * 0.99
        b = torch.randn(B, T, H, m, device="cuda")
        h0 = torch.randn(B, H, m, device="cuda")
        for init in (None, h0):
            if a.backward:
                Ar, br = A.clone().requires_grad_(), b.clone().requires_grad_()
                h = S.block_diagonal_scan(Ar, br, init)[0]
                h.backward(torch.randn_like(h))
                g = (Ar.grad, br.grad)
            else:
                h = S.block_diagonal_scan(A, b, init)[0]
                g = ()
            torch.cuda.synchronize()
            print(json.dumps(dict(m=m, h0=init is not None, nonfinite=int((~torch.isfinite(h)).sum()),
                                  grads_nonfinite=[int((~torch.isfinite(x)).sum()) for x in g])), flush=True)


if __name__ == "__main__":
    main()
