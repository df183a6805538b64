"""``TUNE`` settings of the companion and fused-gate kernels against their defaults, on a GPU:
CUDA-graph medians in interleaved rounds (fp32), with a same-size copy and, with ``--baseline``,
the baseline of the issue's target timed in the same rounds (coefficients: the same recurrence as
dense ``m x m`` companion blocks through ``block_diagonal_scan``; logits / fused: the torch
normalisation, then the materialised scan). Each column's outputs (gradients with ``--bwd``) are
compared with the default's (relative RMS < 1e-5); a mismatch counts as a failed check.
``--route`` (``--kind fused``) times the public entry point instead: ``bdlru_scan`` with
``method="kernel"`` (default column), ``"unfused"`` (baseline) and ``"auto"`` (column ``auto``,
whichever ``fused_gates.unfused_faster`` picks). ``--eager`` times eager calls instead
(``triton.testing.do_bench`` medians, L2 flushed, host launch gaps included: what an un-captured
training step sees).

    python tools/gate_tune_compare.py --kind coeffs --m 4 --shapes 8x2048x768 \\
        --tune ns8=num_stages:8 bn16=bn:16+num_stages:8 [--bwd] [--baseline] [--rounds 3] [--out DIR]

``--kind``: ``coeffs`` (``companion_scan_coeffs``), ``logits`` (``companion_scan``) or ``fused``
(``fused_gate_scan``, ``N = H * m``). TUNE keys: the kernels' ``function.TUNE`` (companion:
``bn``, ``num_warps``, ``num_stages``; fused: ``bh``, ``num_warps``, ``num_stages``, each for
both passes, or with a ``bwd_`` prefix for the backward alone; fused also ``chunk``, the
time-chunk length, 0 = never, and the other keys of ``choose_chunk``), e.g.
``--tune nochunk=chunk:0 c128=chunk:128``. ``--kernels`` also prints each column's GPU kernels
(``torch.profiler``: us and launches a call), to see which pass takes the time.
"""
import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.gated import bdlru_scan  # noqa: E402
from lrnn_scan.gates import normalize_gates  # noqa: E402
from lrnn_scan.kernels.block_diagonal import block_diagonal_scan  # noqa: E402
from lrnn_scan.kernels.companion import function as CF  # noqa: E402
from lrnn_scan.kernels.fused_gates import function as FF  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lb2_compare import _finish, _rel, timed_rounds  # noqa: E402
from tune_compare import kernel_breakdown, parse_tune, shape_rows  # noqa: E402

KINDS = ("coeffs", "logits", "fused")


@contextlib.contextmanager
def tuned(module, tune):
    old = dict(module.TUNE)
    module.TUNE.clear()
    module.TUNE.update(tune)
    try:
        yield
    finally:
        module.TUNE.clear()
        module.TUNE.update(old)


def companion_dense(a):
    """``(B, T, N, m)`` coefficients -> ``(B, T, N, m, m)`` blocks ``[[a_1 … a_m], [I 0]]``; no
    host-to-device copy (an indexed scalar write is one), so it may run inside a CUDA graph."""
    m = a.shape[-1]
    shift = torch.diag(torch.ones(m - 1, device=a.device, dtype=a.dtype), -1)
    return torch.nn.functional.pad(a[..., None, :], (0, 0, 0, m - 1)) + shift


def problem(kind, m, B, T, N, g, route=False):
    """(ours(), baseline() or None, inputs to differentiate, dh, bytes moved fwd / fwd+bwd)."""
    if kind == "fused":
        if N % m:
            raise SystemExit(f"--shapes {B}x{T}x{N}: N must be a multiple of m = {m} for --kind fused")
        H = N // m
        z = torch.randn(B, T, H, m, m + 1, device="cuda", generator=g)
        v = torch.randn(B, T, H, m, device="cuda", generator=g)
        dh = torch.randn(B, T, H, m, device="cuda", generator=g)

        def base():
            A, a0 = normalize_gates(z, "softmax")
            return block_diagonal_scan(A.contiguous(), (a0 * v).contiguous())[0]
        per = (z.numel() + 2 * v.numel(), 3 * z.numel() + 6 * v.numel())
        if route:
            return (lambda method="kernel": bdlru_scan(z, v, method=method)), \
                (lambda: bdlru_scan(z, v, method="unfused")), (z, v), dh, per, FF
        return (lambda: FF.fused_gate_scan(z, v, "softmax")[0]), base, (z, v), dh, per, FF
    if kind == "coeffs":
        z = (torch.rand(B, T, N, m, device="cuda", generator=g) / m)
        v = torch.randn(B, T, N, device="cuda", generator=g)
        dh = torch.randn(B, T, N, device="cuda", generator=g)
        C = companion_dense(z)
        bf = torch.nn.functional.pad(v[..., None], (0, m - 1))

        def base():
            return block_diagonal_scan(C, bf)[0][..., 0]
        ours = lambda: CF.companion_scan_coeffs(z, v)[0]  # noqa: E731
        extra = (C, bf)
    else:
        z = torch.randn(B, T, N, m + 1, device="cuda", generator=g)
        v = torch.randn(B, T, N, device="cuda", generator=g)
        dh = torch.randn(B, T, N, device="cuda", generator=g)

        def base():
            A, a0 = normalize_gates(z, "softmax")
            bb = torch.nn.functional.pad((a0 * v)[..., None], (0, m - 1))
            return block_diagonal_scan(companion_dense(A), bb)[0][..., 0]
        ours = lambda: CF.companion_scan(z, v, "softmax")[0]  # noqa: E731
        extra = ()
    per = (z.numel() + 2 * v.numel(), 3 * z.numel() + 6 * v.numel())
    return ours, base, (z, v) + extra, dh, per, CF


def rows_for(kind, m, shape, tunes, bwd, rounds, baseline, eager=False, route=False, kernels=False):
    B, T, N = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    ours, base, inputs, dh, (nf, nfb), module = problem(kind, m, B, T, N, g, route)
    z, v = inputs[:2]
    if bwd:
        for x in inputs:
            x.requires_grad_()

        def run(tune, call=ours):
            with tuned(module, tune):
                return torch.autograd.grad(call(), (z, v), dh)

        def run_base():
            return torch.autograd.grad(base(), inputs[2:] or (z, v), dh)
    else:
        def run(tune, call=ours):
            with tuned(module, tune), torch.no_grad():
                return (call(),)

        def run_base():
            with torch.no_grad():
                return (base(),)
    fns = {"default": lambda: run({}), **{k: (lambda t=t: run(t)) for k, t in tunes.items()}}
    if route:  # whichever path bdlru_scan(method="auto") picks, default TUNE
        fns["auto"] = lambda: run({}, lambda: ours("auto"))
    ref = [x.double() for x in fns["default"]()]
    worst = max([0.0] + [_rel(x, y) for k, fn in fns.items() if k != "default" for x, y in zip(fn(), ref)])
    if baseline:
        fns["baseline"] = run_base
    if kernels:
        kernel_breakdown(fns)
    timer = None
    if eager:
        from triton.testing import do_bench
        timer = lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")  # noqa: E731
    return timed_rounds(fns, (nfb if bwd else nf) * 4, rounds, timer=timer), worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=KINDS, required=True)
    ap.add_argument("--m", type=int, required=True, help="companion order / block size")
    ap.add_argument("--shapes", nargs="+", default=["8x2048x768"], help="BxTxN")
    ap.add_argument("--tune", nargs="*", default=[], help="columns NAME=key:value+key:value")
    ap.add_argument("--bwd", action="store_true", help="forward+backward rows")
    ap.add_argument("--baseline", action="store_true", help="time the target's baseline too")
    ap.add_argument("--route", action="store_true", help="--kind fused: time bdlru_scan's methods")
    ap.add_argument("--eager", action="store_true", help="eager do_bench medians, not CUDA graphs")
    ap.add_argument("--kernels", action="store_true",
                    help="also print each column's GPU kernels (torch.profiler, us a call)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    tunes = parse_tune(args.tune)
    if args.route and args.kind != "fused":
        raise SystemExit("--route times bdlru_scan: it needs --kind fused")
    fails, rows = shape_rows(args.shapes, f"{args.kind} m={args.m}", args.bwd, lambda shape:
                             rows_for(args.kind, args.m, shape, tunes, args.bwd, args.rounds,
                                      args.baseline, args.eager, args.route, args.kernels))
    print("tunes:", json.dumps(tunes))
    tool = f"gate_tune_compare --kind {args.kind}" + " --route" * args.route + " --eager" * args.eager
    return _finish(args, fails, rows, m=args.m, tool=tool, stem=f"gate_tune_{args.kind}_m{args.m}")


if __name__ == "__main__":
    sys.exit(main())
