"""Is the m = 8 forward at B8 T2048 N768 bound by its step chain or by the bytes it keeps in flight?

The default gather ring (``fwd._bd_fwd_ring`` with ``GATHER``, ring8 there) splits a row of ``A_t``
over 2 lanes: a step is 4 ``FFMA``, one ``SHFL.BFLY`` to finish the row sum and 4 ``SHFL.IDX`` to
send the new state back to the block's lanes, and every slot of ``A`` changes layout by shuffles
(the load takes 4 contiguous columns a lane, the gather columns ``l, l + 2, ..``). This probe runs
a ring that holds a whole row in one thread instead (two 4-wide halves, 4 blocks = 32 rows on one
warp): the row sum is in-thread, ``A`` keeps its load layout, one shuffle latency leaves the step
chain. It has ``D`` ring slots (registers, sm_90a / Triton 3.6: D = 8 114, 16 201, 24 248, no
spills). If the step chain bound the default, the probe would win at equal depth; if the bytes in
flight did, its time follows ``D``.

The fifty-fourth session's answer (H200; ``kernels/block_diagonal/MEASURED.md``, "A whole row of
``A`` a thread"): the time followed ``D`` (B8 T2048 N768: 279 / 217 / 200 us at D = 8 / 16 / 24
against the default's 175), so the ring kept its two lanes a row.

    python tools/rows_probe.py aot --slots 16                       # CPU: sm_90a registers, loop mix
    python tools/rows_probe.py bench --shapes 8x2048x768 --slots 8 16 24 [--rounds 3]   # GPU

The kernel source is generated (one name per slot, like the ring's) into a temporary directory.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]


@triton.jit
def rows_setup(T, H, BH: tl.constexpr):
    """The layout: row ``r`` of the program's ``BH`` blocks (``BH * 8`` rows, one a lane at BH = 4)
    holds row ``r % 8`` of block ``pid * BH + r // 8`` as two 4-wide halves. Returns the sequence
    bounds ``t0, t1`` (program_id(1) = sequence), state offsets / mask ``(BH * 8,)``, the halves'
    ``A`` offsets / mask ``(BH * 8, 4)``, ``idx`` for ``tl.gather`` and the strides of a time row
    of ``b`` and ``A``."""
    pid_h = tl.program_id(0)
    t0 = tl.program_id(1).to(tl.int64) * T
    r = tl.arange(0, BH * 8)
    k = tl.arange(0, 4)
    mask_s = pid_h * BH + r // 8 < H
    offs_s = pid_h * (BH * 8) + r
    offs_lo = offs_s[:, None] * 8 + k[None, :]
    mask_a = mask_s[:, None] & (k < 4)[None, :]
    idx = ((r // 8) * 8)[:, None] + k[None, :]
    return t0, t0 + T, offs_s, mask_s, offs_lo, mask_a, idx, H * 8, H * 64


@triton.jit
def rows_ld(A, Bv, t, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM):
    """Step ``t``'s two halves of ``A`` and ``b`` (zero past ``t1``)."""
    ok = t < t1
    a_lo = tl.load(A + t * HMM + offs_lo, mask=tl.where(ok, mask_a, False), other=0.0)
    a_hi = tl.load(A + t * HMM + offs_lo + 4, mask=tl.where(ok, mask_a, False), other=0.0)
    b = tl.load(Bv + t * HM + offs_s, mask=tl.where(ok, mask_s, False), other=0.0)
    return a_lo, a_hi, b


@triton.jit
def rows_step(Hout, lo, hi, b, xl, xh, t, t1, offs_s, mask_s, HM, idx, BH: tl.constexpr):
    """Step ``t`` (kept state past ``t1``): row sums in-thread, ``h_t`` stored, the state back to
    the block's lanes by two ``tl.gather``."""
    xn = (tl.sum(lo * xl, axis=1) + tl.sum(hi * xh, axis=1)) + b
    tl.store(Hout + t * HM + offs_s, xn, mask=tl.where(t < t1, mask_s, False))
    xb = tl.broadcast_to(xn[:, None], (BH * 8, 4))
    xl = tl.where(t < t1, tl.gather(xb, idx, 0), xl)
    xh = tl.where(t < t1, tl.gather(xb, idx + 4, 0), xh)
    return xl, xh


@triton.jit
def rows_ring_step(A, Bv, Hout, lo, hi, b, xl, xh, t, t1, tn, offs_lo, offs_s, mask_a, mask_s, HM,
                   HMM, idx, BH: tl.constexpr):
    """``rows_step`` on a ring slot, then the slot refilled with step ``tn``."""
    xl, xh = rows_step(Hout, lo, hi, b, xl, xh, t, t1, offs_s, mask_s, HM, idx, BH)
    lo, hi, b = rows_ld(A, Bv, tn, t1, offs_lo, offs_s, mask_a, mask_s, HM, HMM)
    return xl, xh, lo, hi, b


_HEAD = f'''\
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import triton
import triton.language as tl
from rows_probe import rows_ld, rows_ring_step, rows_setup


@triton.jit(do_not_specialize=["T"])
def rows_fwd(A, Bv, Hout, T, H, BH: tl.constexpr):
    """h_t = A_t h_{{t-1}} + b_t from h_0 = 0 for (B, T, H, 8, 8) A; grid (cdiv(H, BH), B)."""
    t0, t1, offs_s, mask_s, offs_lo, mask_a, idx, HM, HMM = rows_setup(T, H, BH)
    xl = tl.zeros([BH * 8, 4], dtype=tl.float32)
    xh = tl.zeros([BH * 8, 4], dtype=tl.float32)
'''


def source(slots: int) -> str:
    """The probe kernel with ``slots`` ring slots (each refilled ``slots`` steps ahead)."""
    args = "offs_lo, offs_s, mask_a, mask_s, HM, HMM"
    lines = [f"    l{i}, h{i}, b{i} = rows_ld(A, Bv, t0 + {i}, t1, {args})" for i in range(slots)]
    lines.append(f"    for ts in range(t0, t1, {slots}):")
    lines += [f"        xl, xh, l{i}, h{i}, b{i} = rows_ring_step(A, Bv, Hout, l{i}, h{i}, b{i}, xl, xh, "
              f"ts + {i}, t1, ts + {slots + i}, {args}, idx, BH)" for i in range(slots)]
    return _HEAD + "\n".join(lines) + "\n"


def load(slots: int):
    """Import the generated kernel module (Triton's JIT reads the source from its file)."""
    path = Path(tempfile.gettempdir()) / f"lrnn_rows_probe_{slots}.py"
    path.write_text(source(slots))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def aot(slots: int, bh: int) -> None:
    """Compile for sm_90a with the Triton on the path (``PYTHONPATH=/tmp/t36``, see aot_check.py)
    and print ptxas' registers / spills and the largest loop's instruction count."""
    sys.path.insert(0, str(ROOT / "tools"))
    from aot_check import compile_sm90a, largest_loop
    sig = {"A": "*fp32", "Bv": "*fp32", "Hout": "*fp32", "T": "i32", "H": "i32", "BH": "constexpr"}
    c = compile_sm90a(load(slots).rows_fwd, sig, {"BH": bh}, 1, aligned=(0, 1, 2))
    print(f"slots {slots} BH {bh}: {'; '.join(c['ptxas'])}; loop {largest_loop(c['sass'])}")


def bench(shapes, slots_list, rounds: int) -> None:
    """Check each probe against the default scan (relative RMS) and time both (CUDA graphs,
    interleaved rounds, with a copy of the same bytes)."""
    import torch
    import triton
    sys.path.insert(0, str(ROOT / "tools"))
    from lb2_compare import timed_rounds
    from lrnn_scan.bench.inputs import stable_blocks
    from lrnn_scan.kernels.block_diagonal.scan import block_diagonal_scan
    for shape in shapes:
        B, T, N = map(int, shape.split("x"))
        if N % 8:
            raise SystemExit(f"--shapes {shape}: N must be a multiple of 8 (m = 8 blocks)")
        H = N // 8
        g = torch.Generator(device="cuda").manual_seed(0)
        A = stable_blocks(B, T, H, 8, 8, generator=g, device="cuda")
        b = torch.randn(B, T, H, 8, device="cuda", generator=g)
        ref = block_diagonal_scan(A, b)[0]
        fns = {"default": lambda: block_diagonal_scan(A, b)}
        for slots in slots_list:
            kernel = load(slots).rows_fwd
            out = torch.full_like(b, float("nan"))  # an unwritten element fails the check

            def run(kernel=kernel, out=out):
                kernel[(triton.cdiv(H, 4), B)](A, b, out, T, H, BH=4, num_warps=1)
                return out
            run()
            err = ((run() - ref).pow(2).mean() / ref.pow(2).mean()).sqrt().item()
            print(f"{shape} D{slots}: relative RMS to the default {err:.2e}", flush=True)
            fns[f"D{slots}"] = run
        t = timed_rounds(fns, A.numel() * 4 + 2 * b.numel() * 4, rounds)
        print(shape, "  ".join(f"{k} {v * 1e3:.1f} us ({100 * t['copy'] / v:.0f} %)" for k, v in t.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("aot", help="sm_90a registers and loop instructions (CPU, Triton 3.6)")
    a.add_argument("--slots", type=int, nargs="+", default=[16])
    a.add_argument("--bh", type=int, default=4, help="blocks a program (4 = one row a lane)")
    b = sub.add_parser("bench", help="check and time against the default forward (GPU)")
    b.add_argument("--shapes", nargs="+", default=["8x2048x768"], help="BxTxN, N a multiple of 8")
    b.add_argument("--slots", type=int, nargs="+", default=[8, 16, 24])
    b.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.cmd == "aot":
        for s in args.slots:
            aot(s, args.bh)
    else:
        bench(args.shapes, args.slots, args.rounds)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
