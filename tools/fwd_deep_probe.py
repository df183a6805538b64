"""Does a deep ``cp.async`` pipeline (shared memory) beat the register ring for the m = 8 forward?

``tools/rows_probe.py`` found the B8 T2048 N768 forward bound by the bytes it keeps in flight in
registers. This probe is the forward twin of ``bwd._bd_bwd_gather``: one step a trip of
``tl.range(..., num_stages=NS)``, whose loads Triton's pipeliner turns into ``cp.async`` copies
``NS - 1`` steps ahead into shared memory (not registers), with the gather ring's step (a row of
``A`` a tensor row, the state back to the lanes by ``tl.gather``). Any m <= 32 (padded rows).

The fifty-fourth session's answer (H200, fp32; ``kernels/block_diagonal/MEASURED.md``, "A deep
``cp.async`` pipeline"): no. The copies left the registers (sm_90a: 46-50 registers at NS = 16-64,
``LDGSTS``), but every step now waits on a ``BAR.SYNC`` and its ``LDS`` of ``A`` before the mat-vec:
B8 T2048 N768 m = 8 213 us at NS = 16 (56 % of copy), 215 / 222 at NS = 32 / 64, against the
register ring's 175 (68 %). ``deep_rows_fwd`` (``--rows G:NS``, m = 8) combines the pipeline with
``tools/rows_probe.py``'s shorter step (a whole row a thread) and pays the barrier once a group of
G steps: slower still, 269-355 us (34-44 %) at B8 T2048 N768, 219-228 us at B16 T1024.

    PYTHONPATH=/tmp/t36 python tools/fwd_deep_probe.py aot --m 8 --ns 16 32 48   # CPU: sm_90a
    python tools/fwd_deep_probe.py bench --m 8 --shapes 8x2048x768 --ns 16 32 48  # GPU
    python tools/fwd_deep_probe.py bench --m 8 --ns --rows 4:8 8:4                # GPU, rows layout
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from lrnn_scan.kernels.block_diagonal.fwd import _padded_rows  # noqa: E402
from rows_probe import rows_ld, rows_setup, rows_step  # noqa: E402  (the whole-row layout)


@triton.jit(do_not_specialize=["T"])
def deep_fwd(A, Bv, Hout, T, H, M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr,
             NS: tl.constexpr):
    """h_t = A_t h_{t-1} + b_t from h_0 = 0, ``(B, T, H, m, m)`` A; grid ``(cdiv(H, BH), B)``."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    t0 = s.to(tl.int64) * T
    t1 = t0 + T
    r, j, blk, offs_s, mask_s, idx = _padded_rows(pid_h, H, M, MP, BH)
    jc = j if M == MP else tl.where(j < M, j, 0)
    offs_a = offs_s[:, None] * M + jc[None, :]
    mask_a = mask_s[:, None] & (j < M)[None, :]
    HM = H * M
    HMM = HM * M
    x = tl.zeros([BH * MP, MP], dtype=tl.float32)
    for t in tl.range(t0, t1, num_stages=NS):
        a = tl.load(A + t * HMM + offs_a, mask=mask_a, other=0.0).to(tl.float32)
        b = tl.load(Bv + t * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32)
        xn = tl.sum(a * x, axis=1) + b
        tl.store(Hout + t * HM + offs_s, xn.to(Hout.dtype.element_ty), mask=mask_s)
        x = tl.gather(tl.broadcast_to(xn[:, None], (BH * MP, MP)), idx, 0)


@triton.jit(do_not_specialize=["T"])
def deep_rows_fwd(A, Bv, Hout, T, H, BH: tl.constexpr, G: tl.constexpr, NS: tl.constexpr):
    """m = 8 only: ``tools/rows_probe.py``'s layout (a whole row of ``A`` a thread, 4 blocks a
    warp) in groups of ``G`` steps (1, 2, 4 or 8) a trip of ``tl.range(num_stages=NS)``: the
    group's loads go ahead into shared memory together, so a barrier and a shared-memory load
    latency are paid once a group, not once a step."""
    t0, t1, offs_s, mask_s, offs_lo, mask_a, idx, HM, HMM = rows_setup(T, H, BH)
    xl = tl.zeros([BH * 8, 4], dtype=tl.float32)
    xh = tl.zeros([BH * 8, 4], dtype=tl.float32)
    for tg in tl.range(t0, t1, G, num_stages=NS):
        l0, h0, b0 = rows_ld(A, Bv, tg, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
        if G >= 2:
            l1, h1, b1 = rows_ld(A, Bv, tg + 1, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
        if G >= 4:
            l2, h2, b2 = rows_ld(A, Bv, tg + 2, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
            l3, h3, b3 = rows_ld(A, Bv, tg + 3, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
        if G >= 8:
            l4, h4, b4 = rows_ld(A, Bv, tg + 4, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
            l5, h5, b5 = rows_ld(A, Bv, tg + 5, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
            l6, h6, b6 = rows_ld(A, Bv, tg + 6, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
            l7, h7, b7 = rows_ld(A, Bv, tg + 7, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
        xl, xh = rows_step(Hout, l0, h0, b0, xl, xh, tg, t1, offs_s, mask_s, HM, idx, BH)
        if G >= 2:
            xl, xh = rows_step(Hout, l1, h1, b1, xl, xh, tg + 1, t1, offs_s, mask_s, HM, idx, BH)
        if G >= 4:
            xl, xh = rows_step(Hout, l2, h2, b2, xl, xh, tg + 2, t1, offs_s, mask_s, HM, idx, BH)
            xl, xh = rows_step(Hout, l3, h3, b3, xl, xh, tg + 3, t1, offs_s, mask_s, HM, idx, BH)
        if G >= 8:
            xl, xh = rows_step(Hout, l4, h4, b4, xl, xh, tg + 4, t1, offs_s, mask_s, HM, idx, BH)
            xl, xh = rows_step(Hout, l5, h5, b5, xl, xh, tg + 5, t1, offs_s, mask_s, HM, idx, BH)
            xl, xh = rows_step(Hout, l6, h6, b6, xl, xh, tg + 6, t1, offs_s, mask_s, HM, idx, BH)
            xl, xh = rows_step(Hout, l7, h7, b7, xl, xh, tg + 7, t1, offs_s, mask_s, HM, idx, BH)


def _cfg(m):
    """``(mp, blocks a program, warps)``: the default ring's launch (``scan._bd_cfg``)."""
    from lrnn_scan.kernels.block_diagonal import scan
    mp, bh, nw, _ = scan._bd_cfg(m)
    return mp, bh, nw


def aot(m, ns):
    """sm_90a (Triton 3.6 on the path, see aot_check.py): shared memory, registers, cp.async
    copies and the largest loop's instructions."""
    from aot_check import compile_sm90a, largest_loop
    mp, bh, nw = _cfg(m)
    sig = {"A": "*fp32", "Bv": "*fp32", "Hout": "*fp32", "T": "i32", "H": "i32",
           "M": "constexpr", "MP": "constexpr", "BH": "constexpr", "NS": "constexpr"}
    c = compile_sm90a(deep_fwd, sig, {"M": m, "MP": mp, "BH": bh, "NS": ns}, nw, aligned=(0, 1, 2))
    print(f"m {m} NS {ns} BH {bh} warps {nw}: smem {c['shared']} B, {'; '.join(c['ptxas'])}, "
          f"LDGSTS {c['sass'].count('LDGSTS')}, loop {largest_loop(c['sass'])}")


def bench(m, shapes, ns_list, rounds, rows=()):
    import torch
    from lb2_compare import timed_rounds
    from lrnn_scan.bench.inputs import stable_blocks
    from lrnn_scan.kernels.block_diagonal.scan import block_diagonal_scan
    mp, bh, nw = _cfg(m)
    for shape in shapes:
        B, T, N = map(int, shape.split("x"))
        H = N // m
        g = torch.Generator(device="cuda").manual_seed(0)
        A = stable_blocks(B, T, H, m, m, generator=g, device="cuda")
        b = torch.randn(B, T, H, m, device="cuda", generator=g)
        ref = block_diagonal_scan(A, b)[0]
        fns = {"default": lambda: block_diagonal_scan(A, b)}
        for ns in ns_list:
            out = torch.full_like(b, float("nan"))

            def run(out=out, ns=ns):
                deep_fwd[(triton.cdiv(H, bh), B)](A, b, out, T, H, M=m, MP=mp, BH=bh, NS=ns, num_warps=nw)
                return out
            err = ((run() - ref).pow(2).mean() / ref.pow(2).mean()).sqrt().item()
            print(f"{shape} m {m} NS{ns}: relative RMS to the default {err:.2e}", flush=True)
            fns[f"ns{ns}"] = run
        for g, ns in rows if m == 8 else ():
            out = torch.full_like(b, float("nan"))

            def run(out=out, g=g, ns=ns):
                deep_rows_fwd[(triton.cdiv(H, 4), B)](A, b, out, T, H, BH=4, G=g, NS=ns, num_warps=1)
                return out
            err = ((run() - ref).pow(2).mean() / ref.pow(2).mean()).sqrt().item()
            print(f"{shape} rows G{g} NS{ns}: relative RMS to the default {err:.2e}", flush=True)
            fns[f"rows_g{g}_ns{ns}"] = run
        t = timed_rounds(fns, A.numel() * 4 + 2 * b.numel() * 4, rounds)
        print(shape, f"m {m}", "  ".join(f"{k} {v * 1e3:.1f} us ({100 * t['copy'] / v:.0f} %)"
                                      for k, v in t.items()), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["aot", "bench"])
    ap.add_argument("--m", type=int, nargs="+", default=[8])
    ap.add_argument("--ns", type=int, nargs="*", default=[16, 32])
    ap.add_argument("--shapes", nargs="+", default=["8x2048x768"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", nargs="*", default=[], metavar="G:NS",
                    help="m = 8: deep_rows_fwd with groups of G steps (1, 2, 4, 8) and NS stages")
    args = ap.parse_args(argv)
    try:
        rows = [tuple(int(v) for v in w.split(":")) for w in args.rows]
    except ValueError:
        raise SystemExit(f"--rows {args.rows}: expected G:NS words, e.g. 8:4") from None
    if any(len(w) != 2 or w[0] not in (1, 2, 4, 8) or w[1] < 1 for w in rows):
        raise SystemExit(f"--rows {args.rows}: expected G:NS with G in 1, 2, 4, 8 and NS >= 1")
    for m in args.m:
        if args.cmd == "aot":
            for ns in args.ns:
                aot(m, ns)
        else:
            bench(m, args.shapes, args.ns, args.rounds, rows)


if __name__ == "__main__":
    main()
