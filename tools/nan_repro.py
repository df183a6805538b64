"""Repeat the GPU run that gave NaN outputs on 2026-11-25 (fifth session, calls 3 and 7; README of
``kernels/block_diagonal``, "Unexplained NaN"), and if it recurs, narrow down where it comes from.

The sequence is that run's: a 1 GiB copy timing, then for m = 2, 4, 8 at B1 T16384 N768 (fp32, the
time-chunked forward): a same-size copy timed with a CUDA graph, the scan without and with an
initial state, then four times ``scan; do_bench(scan); do_bench_cudagraph(scan)``. That run gave an
all-NaN output after the first 256-step chunk at m = 8, identical in every call of the process;
a fresh process running the same forward alone did not.

After every scan call the output's NaN / inf count is printed. At the first NaN the script checks
that the inputs still hold what they were created with (a float64 checksum), re-runs the three
stages of the chunked forward by hand (chunk summaries ``P, E``; the carry scan ``X``; the re-run)
and reports which one first holds a non-finite value, and repeats the scan on fresh copies of
the inputs::

    python tools/nan_repro.py [--m 2 4 8] [--shape 1x16384x768]
"""
from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench, do_bench_cudagraph

from lrnn_scan.kernels.block_diagonal import scan as S


def nonfinite(x):
    return dict(nan=int(torch.isnan(x).sum()), inf=int(torch.isinf(x).sum()))


def tensor_stats(x):
    """Non-finite counts and the largest magnitude: a corrupted input shows here."""
    return dict(nonfinite(x), absmax=float(x.abs().max()))


def per_chunk(h, chunk=256):
    """Non-finite counts of the output per ``chunk`` steps (which chunks went bad)."""
    bad = (~torch.isfinite(h)).flatten(2).sum(-1).sum(0)  # (T,)
    parts = [int(v.sum()) for v in bad.split(chunk)]
    return parts[:8] + ["..."] + parts[-2:]


def stages(A, b):
    """The chunked forward's three stages, run by hand with the launcher's own helpers."""
    B, T, H, m = b.shape
    mp, bh, nw, ns = S._bd_cfg(m)
    chunk = S._choose_chunk(B * -(-H // bh), T, A.device, 1, m) or T  # as the forward picks it
    nc = -(-T // chunk)
    P = torch.full((B, nc, H, m, m), float("nan"), device=A.device)
    E = torch.full((B, nc, H, m), float("nan"), device=A.device)
    S._summary_launch(A, b, P, E, b, T, H, chunk, nc, B, m, mp, bh, nw, ns, False)
    X = torch.full((B, nc, H, m), float("nan"), device=A.device)
    final = torch.full((B, H, m), float("nan"), device=A.device)
    S._fwd_launch((-(-H // bh), B, 1), P, E, X, b, final, b, nc, H, nc, 1, M=m, MP=mp, BH=bh, NS=ns,
                  HAS_INIT=False, STORE_H=True, STORE_FINAL=True, VARLEN=False, num_warps=nw)
    ref_final = S.block_diagonal_scan(A, b, None, True)[1]
    return dict(chunk=chunk, P=nonfinite(P), E=nonfinite(E), X=nonfinite(X), final=nonfinite(final),
                P_absmax=float(P.abs().max()), E_absmax=float(E.abs().max()),
                final_vs_scan=float((final - ref_final).norm() / ref_final.norm()))


def diagnose(A, b, init, h, others, out=None):
    """Called in the process where the forward gave a non-finite output (``tools/fwd_bh_sweep.py
    --diagnose``): where the inputs and neighbouring buffers lie, whether the call changed its
    inputs, whether fresh copies / the unchunked path / each chunked stage / a float64 loop over
    the first chunk are finite, and whether the output depends on what ``others`` (e.g. the
    benchmark's uninitialised copy buffers) hold. Saves the first chunk's inputs to ``out``."""
    rep = {}
    named = dict(A=A, b=b, init=init, h=h, **others)
    rep["addresses"] = {k: [hex(v.data_ptr()), hex(v.data_ptr() + v.numel() * v.element_size())]
                        for k, v in named.items() if v is not None}
    rep["A"], rep["b"] = tensor_stats(A), tensor_stats(b)
    rep["A_rowsum_max"] = float(A.sum(-1).max())
    rep["others"] = {k: tensor_stats(v) for k, v in others.items()}
    rep["h"], rep["bad_per_chunk"] = nonfinite(h), per_chunk(h)
    sums = (A.double().sum().item(), b.double().sum().item())
    rep["again"] = nonfinite(S.block_diagonal_scan(A, b, init)[0])
    rep["inputs_unchanged_by_call"] = sums == (A.double().sum().item(), b.double().sum().item())
    rep["fresh_copies"] = nonfinite(S.block_diagonal_scan(A.clone(), b.clone(),
                                                          None if init is None else init.clone())[0])
    with S.tuned({"chunk": 0}):
        rep["unchunked"] = nonfinite(S.block_diagonal_scan(A, b, init)[0])
    with S.tuned({"summary": "v1"}):
        rep["summary_v1"] = nonfinite(S.block_diagonal_scan(A, b, init)[0])
    rep["stages"] = stages(A, b)
    # float64 loop over the first 256 steps, all blocks
    x = (torch.zeros_like(b[:, 0]) if init is None else init).double()
    A64, b64 = A[:, :256].double(), b[:, :256].double()
    ref = []
    for t in range(A64.shape[1]):
        x = torch.einsum("bhij,bhj->bhi", A64[:, t], x) + b64[:, t]
        ref.append(x)
    ref = torch.stack(ref, 1)
    rep["loop64_chunk0"] = dict(nonfinite(ref), absmax=float(ref.abs().max()),
                                rel_err_h=float((h[:, :256].double() - ref).norm() / ref.norm()))
    for k, v in others.items():
        v.zero_()
    rep["others_zeroed"] = nonfinite(S.block_diagonal_scan(A, b, init)[0])
    for k, v in others.items():
        v.fill_(float("nan"))
    rep["others_nan"] = nonfinite(S.block_diagonal_scan(A, b, init)[0])
    if out:
        torch.save(dict(A=A[:, :256].cpu(), b=b[:, :256].cpu(), init=None if init is None else init.cpu(),
                        h=h[:, :256].cpu()), out)
        rep["saved"] = str(out)
    print("DIAGNOSE " + json.dumps(rep), flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--shape", default="1x16384x768", help="BxTxN")
    a = ap.parse_args()
    B, T, N = (int(x) for x in a.shape.split("x"))
    x = torch.empty(1 << 28, device="cuda")
    y = torch.empty_like(x)
    do_bench(lambda: y.copy_(x))
    del x, y
    for m in a.m:
        H = N // m
        A = torch.rand(B, T, H, m, m, device="cuda")
        A = A / A.sum(-1, keepdim=True) * 0.99
        b = torch.randn(B, T, H, m, device="cuda")
        sums = (A.double().sum().item(), b.double().sum().item())
        src = torch.empty((A.numel() + 2 * b.numel()) // 2, device="cuda")
        dst = torch.empty_like(src)
        do_bench_cudagraph(lambda: dst.copy_(src), rep=40)
        h0 = torch.randn(B, H, m, device="cuda")
        seen = False
        calls = [("ref", None), ("ref_h0", h0)] + [(f"cfg{i}", h0 if i >= 2 else None) for i in range(4)]
        for name, init in calls:
            f = lambda: S.block_diagonal_scan(A, b, init)  # noqa: E731
            h = f()[0]
            row = dict(m=m, call=name, h0=init is not None, **nonfinite(h))
            now = (A.double().sum().item(), b.double().sum().item())
            if now != sums:  # the inputs changed under us: say so at the call where it happened
                row["inputs_changed"] = dict(A=tensor_stats(A), b=tensor_stats(b))
            if row["nan"] and not seen:
                seen = True
                row["inputs_unchanged"] = sums == now
                row["A"], row["b"] = tensor_stats(A), tensor_stats(b)
                row["A_rowsum_max"] = float(A.sum(-1).max())
                row["bad_per_chunk"] = per_chunk(h)
                row["stages"] = stages(A, b)
                row["fresh_copies"] = nonfinite(S.block_diagonal_scan(A.clone(), b.clone(), init)[0])
                bad = torch.isnan(h).nonzero()
                row["first_nan_t"] = int(bad[:, 1].min())
            print(json.dumps(row), flush=True)
            if name.startswith("cfg"):
                do_bench(f, warmup=10, rep=40)
                do_bench_cudagraph(f, rep=40)
        del A, b, h0, h, src, dst
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
