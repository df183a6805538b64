"""Driver scripts for ``tools/jit_cache.py build``: the library calls of a ``tools/gpu_owed.sh``
stage, at its shapes and settings, so that the kernels it launches on the GPU are compiled here.
The kernels do not run (outputs are garbage); only what keys a kernel matters: dtypes, 16-byte
divisibility of the integer arguments and pointers, integers equal to 1, constexprs, options.

    PYTHONPATH=/tmp/t36 python tools/jit_cache.py build ... -- tools/jit_cache_runs.py lbthread [--m 8 6 4]
    ... -- tools/jit_cache_runs.py tune --m 8 --bwd --shapes 1x16384x768 --tune r256='{"rerun_len":256}'
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def tune(m, shapes, tunes, bwd=False, dtype="fp32"):
    """tools/tune_compare.py's columns (the default, then each ``TUNE`` override) at ``shapes``
    (``BxTxN`` words): ``S.block_diagonal_scan(A, b)`` under ``S.tuned``, forward, or with
    ``bwd`` its gradients for ``A`` and ``b``."""
    for sh in shapes:
        B, T, N = (int(x) for x in sh.split("x"))
        A = torch.zeros(B, T, N // m, m, m, dtype=_DTYPES[dtype], requires_grad=bwd)
        b = torch.zeros(B, T, N // m, m, dtype=_DTYPES[dtype], requires_grad=bwd)
        for t in [{}] + list(tunes.values()):
            with S.tuned(t):
                h = S.block_diagonal_scan(A, b)[0]
                if bwd:
                    torch.autograd.grad(h, (A, b), torch.zeros_like(h))
        print(f"tune m={m} {sh} {'fwd+bwd' if bwd else 'fwd'} {dtype}: {1 + len(tunes)} columns", flush=True)


def lbthread_race(m):
    """``tests/test_kernels_lookback_thread.py -k gpu_many`` (h0, final state, varlen; ``TUNE``
    cleared, then set)."""
    saved = dict(S.TUNE)
    try:
        for chunk, walk in ((8, "compose"), (32, "compose"), (8, "forward")):
            S.TUNE.clear()
            S.TUNE.update(bd_lookback=True, bdlb_kind="thread", lbt_chunk=chunk, lbt_walk=walk)
            for B, T, H, cu in ((1, 16384, 768 // m, None),
                                (1, 9000, 384 // m, torch.tensor([0, 1, 4003, 4003, 9000]))):
                A, b = torch.zeros(B, T, H, m, m), torch.zeros(B, T, H, m)
                h0 = torch.zeros(B if cu is None else cu.numel() - 1, H, m)
                with torch.no_grad():
                    S.block_diagonal_scan(A, b, h0, True, cu)
    finally:
        S.TUNE.clear()
        S.TUNE.update(saved)
    print(f"lbthread race test m={m}", flush=True)


def check(m, B, T, H, h0=False, cu=None, final=True, dtype="fp32"):
    """tests/gpu/test_gpu_block_diagonal.py's ``check``: the scan with ``output_final_state``,
    then the gradients for ``A``, ``b`` (and ``h0``), with or without a final-state gradient."""
    A = torch.zeros(B, T, H, m, m, dtype=_DTYPES[dtype], requires_grad=True)
    b = torch.zeros(B, T, H, m, dtype=_DTYPES[dtype], requires_grad=True)
    x0 = torch.zeros(B if cu is None else cu.numel() - 1, H, m, requires_grad=True) if h0 else None
    h, hf = S.block_diagonal_scan(A, b, x0, True, cu)
    ins = (A, b) + ((x0,) if h0 else ())
    torch.autograd.grad(h.float().sum() + (hf.sum() if final else 0), ins)


def rerun():
    """``gpu_owed.sh rerun``: test_rerun_over_summary_chunks, then its tune_compare columns."""
    T = 65536
    for m, rl in ((4, 256), (6, 512), (8, 256)):
        with S.tuned(dict(rerun_len=rl)):
            check(m, 1, T, 384 // m, True, torch.tensor([0, 5, 30001, 30001, 47000, T]))
            check(m, 1, T, 384 // m)
        print(f"rerun test m={m}", flush=True)
    for m in (4, 8):
        tune(m, ["1x16384x768", "1x65536x768"], {"r256": {"rerun_len": 256}, "r512": {"rerun_len": 512}})
    tune(8, ["1x16384x768"], {"r256": {"rerun_len": 256}}, bwd=True)
    tune(6, ["1x16384x768", "16x2048x768"], {"ring2": {"bwd_variant": "ring2"},
                                             "v1g": {"bwd_variant": "v1", "bwd_gather": True}}, bwd=True)


def sumthread(big=True):
    """``gpu_owed.sh sumthread``'s tests: summary_thread_chunked, long_chunked_varlen,
    inference_plans_batch1 and (``big``: 4-5 GB of zeros a tensor here) more_than_2_31_elements."""
    cu6002 = torch.tensor([0, 5, 1000, 1000, 2500, 6002])
    for m in (3, 4, 5, 8):
        for chunk in (64, 256):
            with S.tuned(dict(summary="thread", chunk=chunk)):
                for dtype in ("fp32", "bf16"):
                    check(m, 1, 6002, 384 // m, True, cu6002, dtype=dtype)
                check(m, 2, 3001, 96 // m, True)
        print(f"summary_thread_chunked m={m}", flush=True)
    T = 65536
    cu = torch.tensor([0, 5, 30001, 30001, 47000, T])
    for m in (1, 2, 4, 8, 16):
        check(m, 1, T, 256 // m, True, cu)
        check(m, 1, T, 256 // m)
        print(f"long_chunked_varlen m={m}", flush=True)
    cu = torch.tensor([0, 7, 5000, 5000, 12289, 16384])
    for m in (1, 2, 3, 4, 8, 16, 32):
        H = 768 // m if m != 3 else 256
        A, b = torch.zeros(1, 16384, H, m, m), torch.zeros(1, 16384, H, m)
        with torch.no_grad():
            S.block_diagonal_scan(A, b, torch.zeros(1, H, m), True, None)
            S.block_diagonal_scan(A, b, torch.zeros(5, H, m), True, cu)
        print(f"inference_plans_batch1 m={m}", flush=True)
    if big:
        for H, m, t in ((160, 16, {}), (520, 8, {"summary": "thread", "chunk": 256})):
            with S.tuned(t):
                check(m, 1, T, H, dtype="bf16")
            print(f"more_than_2_31_elements m={m}", flush=True)


def delta(nhs, gated=(False, True), shape="8x4096x16x128x128"):
    """The delta-product fwd+bwd (tools/ncu_delta.py, benchmarks/delta_throughput.py; bf16,
    B8 T4096 H16 K=V=128) and its forward without gradients, at each ``n_h``, gated and not."""
    from benchmarks import delta_throughput as bench
    from lrnn_scan.delta import chunk_delta_product
    bench.DEVICE = "cpu"
    B, T, H, K, V = (int(x) for x in shape.split("x"))
    for nh in nhs:
        for gt in gated:
            q, k, v, beta, g = bench.inputs(B, T, nh, H, K, V, gt, dtype=torch.bfloat16)
            xs = [x.requires_grad_() for x in (q, k, v, beta) + ((g,) if gt else ())]
            with torch.no_grad():
                chunk_delta_product(q, k, v, beta, g, backend="triton")
            o = chunk_delta_product(q, k, v, beta, g, backend="triton")[0]
            torch.autograd.grad(o, xs, torch.ones_like(o))
            print(f"delta n_h={nh} gated={gt}", flush=True)


def lbthread(ms):
    """``gpu_owed.sh lbthread``: the race test, then tune_compare's forward columns."""
    lbt = dict(bd_lookback="always", bdlb_kind="thread")
    tunes = {f"t{c}": dict(lbt, lbt_chunk=c) for c in (8, 16, 32, 64)}
    tunes.update({f"f{c}": dict(lbt, lbt_chunk=c, lbt_walk="forward") for c in (16, 32)})
    for m in ms:
        lbthread_race(m)
        tune(m, ["1x16384x768", "8x2048x768"], tunes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tune", help="tools/tune_compare.py's columns (same arguments)")
    t.add_argument("--m", type=int, required=True)
    t.add_argument("--shapes", nargs="+", default=["8x2048x768"])
    t.add_argument("--tune", nargs="*", default=[])
    t.add_argument("--bwd", action="store_true")
    t.add_argument("--dtype", choices=sorted(_DTYPES), default="fp32")
    s = sub.add_parser("lbthread", help="gpu_owed.sh lbthread")
    s.add_argument("--m", type=int, nargs="+", default=[8, 6, 4])
    sub.add_parser("rerun", help="gpu_owed.sh rerun")
    sub.add_parser("sumthread", help="gpu_owed.sh sumthread's tests")
    d = sub.add_parser("delta", help="the delta-product fwd+bwd and forward (ncubytes, deltafla)")
    d.add_argument("--nh", type=int, nargs="+", default=[1, 2, 3, 4])
    a = ap.parse_args()
    if a.what == "tune":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from tune_compare import parse_tune
        tune(a.m, a.shapes, parse_tune(a.tune), a.bwd, a.dtype)
    elif a.what == "delta":
        delta(a.nh)
    elif a.what == "sumthread":
        sumthread()
    elif a.what == "rerun":
        rerun()
    else:
        lbthread(a.m)


if __name__ == "__main__":
    main()
