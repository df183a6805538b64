"""Sequence-parallel scan (``lrnn_scan.distributed``): equality with the one-device scan and the
time on 1 vs N devices, per operator family (and the DeltaProduct chunk path). Appends a dated
table to ``benchmarks/RESULTS.md`` (rank 0 writes).

Two GPUs (NCCL; keep NVLink multicast off)::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
        torchrun --standalone --nproc-per-node 2 benchmarks/distributed_scan.py          # T = 2^20

CPU smoke run (gloo, tiny sizes)::

    torchrun --standalone --nproc-per-node 2 benchmarks/distributed_scan.py --backend gloo --T 4096

Per family (``--families``, default ``diagonal,block_diagonal,companion,householder,delta``):

1. every rank builds the same whole-sequence problem (seeded) on its device;
2. **equality** (even split): every rank runs the one-device function on the whole sequence
   (``lrnn_scan.scan`` or ``lrnn_scan.delta.chunk_delta_product``; forward and backward of
   ``<w, h> + <w_f, h_T>``) and compares its shard of the outputs, the final state and all
   gradients (inputs, operator tensors, ``initial_state`` on rank 0) with the distributed run;
   the worst relative error over ranks is checked against ``--tol``;
3. **timing** (median of ``--reps`` after ``--warmup``): rank 0 alone times the one-device run of
   the whole sequence (forward, and forward + backward) while the others wait; then all ranks time
   the distributed run (the slowest rank counts), once with an even split and once with rank 0
   given a larger share (rank 0 does no shard reduction). ``--first-weight auto`` (default) sets
   that share from timing one shard's reduction and one local run on rank 0;
   ``--first-weight 1`` times the even split only.

Shapes (GPU defaults, ~1-4 GiB per input at T = 2^20; tiny on CPU): ``diagonal`` a, b
``(B, T, N)``; ``block_diagonal`` A ``(B, T, H, m, m)``; ``companion`` a ``(B, T, N, m)`` with
newest-only b ``(B, T, N)`` (the H-LRU kernel layout); ``householder`` keys
``(B, T, H, n_h, d_k)`` with a ``d_k x d_v`` matrix state (no Triton scan kernel: the local scans
are the torch Blelloch scan); ``delta`` q ``(B, T, H, K)``, k/v ``(B, T, n_h, H, K|V)``
(``chunk_delta_product``, Triton backend on CUDA).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lrnn_scan as ls  # noqa: E402
from lrnn_scan import distributed as lsd  # noqa: E402
from lrnn_scan.bench.inputs import stable_blocks  # noqa: E402
from lrnn_scan.dispatch import kernel_for  # noqa: E402

FAMILIES = ("diagonal", "block_diagonal", "companion", "householder", "delta")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default=None, help="nccl (default with CUDA) or gloo")
    p.add_argument("--T", type=int, default=1 << 20, help="whole sequence length (default 2^20)")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"))
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--N", type=int, default=None, help="channels (diagonal, companion)")
    p.add_argument("--H", type=int, default=None, help="blocks / heads")
    p.add_argument("--m", type=int, default=None, help="block size / companion order")
    p.add_argument("--dk", type=int, default=None, help="key size d_k (householder, delta)")
    p.add_argument("--dv", type=int, default=None, help="state columns d_v (0: vector state)")
    p.add_argument("--nh", type=int, default=2, help="Householder factors per step")
    p.add_argument("--method", default="auto", help="local scan method (lrnn_scan.scan)")
    p.add_argument("--first-weight", default="auto",
                   help="rank 0's share of T relative to each other rank for the second timing "
                        "row: a number, or 'auto' (measured); 1 = even split only")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--tol", type=float, default=None, help="max relative error (default by dtype)")
    p.add_argument("--skip-equality", action="store_true")
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"),
                   help="markdown file to append to ('' to not write)")
    return p.parse_args()


def log(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


def widths(args, dev, family):
    """Per-family defaults: ~1-4 GiB per input tensor at T = 2^20 on a GPU, tiny on CPU."""
    gpu = dev.type == "cuda"
    N = {"diagonal": 512, "companion": 256}.get(family, 0) if gpu else 8
    H = {"block_diagonal": 32, "householder": 2, "delta": 4}.get(family, 0) if gpu else 2
    dk = {"householder": 16, "delta": 64}.get(family, 0) if gpu else 4
    dv = {"householder": 16, "delta": 64}.get(family, 0) if gpu else 3
    return dict(N=args.N or N, H=args.H or H, m=args.m or (4 if gpu else 3), dk=args.dk or dk,
                dv=dv if args.dv is None else args.dv)


class Problem:
    """A whole-sequence problem: ``inputs`` (time at dim 1), ``h0``, loss weights, and the
    one-device / distributed functions ``(inputs, h0) -> (out, final)``."""

    def __init__(self, family, B, T, w, nh, dtype, dev, method, seed=0):
        g = torch.Generator(device=dev).manual_seed(seed)
        rnd = lambda *s: torch.randn(*s, generator=g, device=dev)  # noqa: E731
        uni = lambda *s: torch.rand(*s, generator=g, device=dev)  # noqa: E731
        self.family, self.method = family, method
        if family == "delta":
            H, K, V = w["H"], w["dk"], w["dv"] or w["dk"]
            q = rnd(B, T, H, K)
            k = torch.nn.functional.normalize(rnd(B, T, nh, H, K), dim=-1)
            v = rnd(B, T, nh, H, V)
            beta = 2 * uni(B, T, nh, H)
            lg = torch.nn.functional.logsigmoid(rnd(B, T, H) + 4.0)
            self.inputs = [x.to(dtype) for x in (q, k, v, beta, lg)]
            self.h0 = rnd(B, H, K, V).to(dtype)
            out_shape, state = (B, T, H, V), (B, H, K, V)
            self.shape = f"B={B} H={H} n_h={nh} K={K} V={V} (chunk_delta_product)"
            self.path = "triton" if dev.type == "cuda" and dtype != torch.float64 else "torch"
        else:
            if family == "diagonal":
                op = ls.Diagonal(0.5 + 0.5 * uni(B, T, w["N"]))
                bshape, state = (B, T, w["N"]), (B, w["N"])
                self.shape = f"B={B} N={w['N']}"
            elif family == "block_diagonal":
                m = w["m"]
                op = ls.BlockDiagonal(stable_blocks(B, T, w["H"], m, m, generator=g, device=dev))
                bshape, state = (B, T, w["H"], m), (B, w["H"], m)
                self.shape = f"B={B} H={w['H']} m={m}"
            elif family == "companion":
                m = w["m"]
                op = ls.Companion(stable_blocks(B, T, w["N"], m, generator=g, device=dev))
                bshape, state = (B, T, w["N"]), (B, w["N"], m)                  # newest-only b
                self.shape = f"B={B} N={w['N']} m={m} (newest-only b)"
            elif family == "householder":
                keys = torch.nn.functional.normalize(rnd(B, T, w["H"], nh, w["dk"]), dim=-1)
                op = ls.HouseholderProduct(keys, 2 * uni(B, T, w["H"], nh),
                                           0.9 + 0.1 * uni(B, T, w["H"]), check_values=False)
                tail = (w["dv"],) if w["dv"] else ()
                bshape, state = (B, T, w["H"], w["dk"], *tail), (B, w["H"], w["dk"], *tail)
                self.shape = (f"B={B} H={w['H']} n_h={nh} d_k={w['dk']} "
                              + (f"d_v={w['dv']}" if w["dv"] else "vector"))
            else:
                raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
            op = op.map(lambda t: t.to(dtype))
            self.template = op
            self.inputs = [rnd(*bshape).to(dtype), *op.tensors()]
            self.h0 = rnd(*state).to(dtype)
            out_shape = bshape
            lo, hi = lsd.shard_bounds(T, dist.get_world_size(), dist.get_rank())
            kname, _ = kernel_for(op.select_time(1, slice(lo, hi)), self.inputs[0][:, lo:hi], 1,
                                  False, None)
            self.path = kname or "torch blelloch"
        self.wh = rnd(*out_shape).to(dtype)
        self.wf = rnd(*state)

    def run(self, inputs, h0, distributed: bool, final=True):
        if self.family == "delta":
            fn = lsd.chunk_delta_product if distributed else ls_delta()
            return fn(*inputs, initial_state=h0, output_final_state=final)
        op = self.template.with_tensors(*inputs[1:])
        fn = lsd.scan if distributed else ls.scan
        out = fn(op, inputs[0], initial_state=h0, output_final_state=final, method=self.method)
        return out if final else (out, None)


def ls_delta():
    from lrnn_scan.delta import chunk_delta_product
    return chunk_delta_product


def rel_err(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    den = ref.norm().item()
    return (x - ref).norm().item() / (den if den > 0 else 1.0)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timeit(fn, dev, warmup, reps, barrier=False):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if barrier:
            dist.barrier()
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def equality(pb: Problem, lo, hi):
    """Worst relative error of the distributed run vs the one-device run, over all outputs."""
    rank = dist.get_rank()

    def run(inputs, w, dist_mode):
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        h0 = pb.h0.detach().clone().requires_grad_()
        out, f = pb.run(xs, h0, dist_mode)
        wf = pb.wf if (not dist_mode or rank == 0) else torch.zeros_like(pb.wf)
        ((out.float() * w.float()).sum() + (f.float() * wf).sum()).backward()
        return out.detach(), f.detach(), [x.grad for x in xs], h0.grad

    ref = run(pb.inputs, pb.wh, False)
    ref = (ref[0][:, lo:hi], ref[1], [g[:, lo:hi] for g in ref[2]], ref[3])
    out = run([x[:, lo:hi] for x in pb.inputs], pb.wh[:, lo:hi], True)
    errs = {"out": rel_err(out[0], ref[0]), "final": rel_err(out[1], ref[1])}
    for i, (g, r) in enumerate(zip(out[2], ref[2])):
        errs[f"dinput{i}"] = rel_err(g, r)
    if rank == 0:
        errs["dh0"] = rel_err(out[3], ref[3])
    del ref, out
    worst = torch.tensor([max(errs.values())], dtype=torch.float64, device=pb.wh.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst.item(), errs


def local_costs(pb: Problem, T_shard, dev, warmup, reps):
    """On this rank: ms of one shard's reduction (what ranks > 0 do before the exchange) and of
    one local forward over the shard (what rank 0 does) — to balance the split."""
    xs = [x[:, :T_shard] for x in pb.inputs]
    if pb.family == "delta":
        from lrnn_scan.distributed.delta import _DeltaCfg, _delta_totals
        q, k, v = xs[0], xs[1], xs[2]
        B, T, H, K = q.shape
        cfg = _DeltaCfg(None, 1, 2, K ** -0.5, 64, pb.path, (B, T, k.shape[2], H, K, v.shape[-1]),
                        torch.float64 if q.dtype == torch.float64 else torch.float32)
        red = lambda: _delta_totals(cfg, *xs)  # noqa: E731
    else:
        op = pb.template.with_tensors(*xs[1:])
        cdt = torch.promote_types(xs[0].dtype, torch.float32)
        newest = isinstance(op, ls.Companion) and xs[0].dim() == op.batch_ndim

        def red():
            b = xs[0].to(cdt)
            if newest:
                b = torch.stack([b, *[torch.zeros_like(b)] * (op.state_size - 1)], -1)
            P, f = lsd.tree_reduce(op.map(lambda t: t.to(cdt)), b, 1)
            return P.to_dense(), f
    with torch.no_grad():
        t_red = timeit(red, dev, warmup, reps)
        t_loc = timeit(lambda: pb.run(xs, pb.h0, False), dev, warmup, reps)
    return t_red, t_loc


def time_family(pb: Problem, args, dev, weights, warmup, reps):
    rank, world = dist.get_rank(), dist.get_world_size()
    T = pb.inputs[0].shape[1]
    lo, hi = lsd.shard_bounds(T, world, rank, weights=weights)
    xs = [x[:, lo:hi] for x in pb.inputs]
    wh = pb.wh[:, lo:hi]
    gx = [x.detach().requires_grad_() for x in xs]

    def n_fwd():
        with torch.no_grad():
            pb.run(xs, pb.h0, True, final=False)

    def n_fb():
        out, _ = pb.run(gx, pb.h0, True, final=False)
        out.backward(wh)

    tn = torch.tensor([timeit(n_fwd, dev, warmup, reps, barrier=True),
                       timeit(n_fb, dev, warmup, reps, barrier=True)],
                      dtype=torch.float64, device=dev)
    dist.all_reduce(tn, op=dist.ReduceOp.MAX)
    return tn[0].item(), tn[1].item()


def main():
    args = parse_args()
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    backend = args.backend or ("nccl" if use_cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get(
            "LOCAL_WORLD_SIZE", 1))))
    dist.init_process_group(backend, timeout=_dt.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    tol = args.tol or {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
    reps = args.reps or (10 if use_cuda else 3)
    warmup = args.warmup or (3 if use_cuda else 1)
    even = lsd.shard_bounds(args.T, world, rank)
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": (torch.cuda.get_device_name(dev) if use_cuda else
                   f"CPU ({platform.processor() or platform.machine()}, "
                   f"{torch.get_num_threads()} threads/rank)"),
        "torch": torch.__version__, "lrnn_scan": ls.__version__,
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "-"
    if use_cuda:
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    log(f"world={world} backend={backend} device={env['device']} T={args.T} dtype={args.dtype}")
    rows = []
    for family in [f for f in args.families.split(",") if f]:
        row = {"family": family, "shape": "?", "path": "?"}
        try:
            pb = Problem(family, args.B, args.T, widths(args, dev, family), args.nh, dtype, dev,
                         args.method)
            row.update(shape=pb.shape, path=pb.path)
            if not args.skip_equality:
                worst, errs = equality(pb, *even)
                row["err"], row["ok"] = worst, worst <= tol
                log(f"[{family}] equality: worst rel err over ranks {worst:.2e} "
                    f"({'PASS' if worst <= tol else 'FAIL'}, tol {tol:.0e}); rank 0: "
                    + ", ".join(f"{k}={v:.1e}" for k, v in errs.items()))
            if not args.skip_timing:
                gx = [x.detach().requires_grad_() for x in pb.inputs]

                def one_fwd():
                    with torch.no_grad():
                        pb.run(pb.inputs, pb.h0, False, final=False)

                def one_fb():
                    out, _ = pb.run(gx, pb.h0, False, final=False)
                    out.backward(pb.wh)

                t1 = torch.zeros(4, dtype=torch.float64, device=dev)
                if rank == 0:
                    t1[0] = timeit(one_fwd, dev, warmup, reps)
                    t1[1] = timeit(one_fb, dev, warmup, reps)
                    if args.first_weight == "auto" and world > 1:
                        t1[2], t1[3] = local_costs(pb, args.T // world, dev, warmup, reps)
                del gx
                dist.broadcast(t1, 0)
                row.update(t1_fwd=t1[0].item(), t1_fb=t1[1].item())
                row["even"] = time_family(pb, args, dev, None, warmup, reps)
                if args.first_weight == "auto":
                    w0 = (t1[2].item() + t1[3].item()) / max(t1[3].item(), 1e-9) \
                        if world > 1 else 1.0
                else:
                    w0 = float(args.first_weight)
                row["red_ms"], row["loc_ms"] = t1[2].item(), t1[3].item()
                if world > 1 and abs(w0 - 1.0) > 0.05:
                    row["w0"] = w0
                    row["weighted"] = time_family(pb, args, dev, [w0] + [1.0] * (world - 1),
                                                  warmup, reps)
                msg = (f"[{family}] 1 device: fwd {row['t1_fwd']:.3f} ms, fwd+bwd "
                       f"{row['t1_fb']:.3f} ms | {world} ranks even: fwd {row['even'][0]:.3f} ms "
                       f"({row['t1_fwd'] / row['even'][0]:.2f}x), fwd+bwd {row['even'][1]:.3f} ms "
                       f"({row['t1_fb'] / row['even'][1]:.2f}x)")
                if "weighted" in row:
                    msg += (f" | rank-0 weight {row['w0']:.2f}: fwd {row['weighted'][0]:.3f} ms "
                            f"({row['t1_fwd'] / row['weighted'][0]:.2f}x), fwd+bwd "
                            f"{row['weighted'][1]:.3f} ms "
                            f"({row['t1_fb'] / row['weighted'][1]:.2f}x)")
                log(msg)
            del pb
        except Exception as exc:                          # noqa: BLE001 - recorded in the row
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            row["ok"] = False
            print(f"[rank {rank}] [{family}] FAILED:\n{traceback.format_exc()}", flush=True)
        rows.append(row)
        if rank == 0 and args.results:       # row by row: a run cut short keeps what it measured
            if len(rows) == 1:
                write_header(Path(args.results), env, args, world, backend, reps, tol)
            write_row(Path(args.results), row)
            log(f"[{family}] appended to {args.results}")
        if use_cuda:
            torch.cuda.empty_cache()

    ok = all(r.get("ok", True) for r in rows)
    dist.barrier()
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def write_header(res: Path, env, args, world, backend, reps, tol):
    new = not res.exists()
    with open(res, "a") as f:
        if new:
            f.write("# Benchmark results\n\nRows appended by the benchmark scripts; newest last.\n")
        f.write(f"\n### sequence-parallel scan — {env['date']} — {world} x {env['device']}, "
                f"backend {backend}" + (f" (NCCL {env['nccl']})" if "nccl" in env else "")
                + f", torch {env['torch']}, Triton {env['triton']}, lrnn_scan "
                f"{env['lrnn_scan']}, {args.dtype}, T = {args.T}\n"
                f"(`benchmarks/distributed_scan.py`, method={args.method}; 1-dev = one device "
                f"runs the one-device function on the whole sequence; {world}-dev = "
                f"`lrnn_scan.distributed`, time of the slowest rank, median of {reps}; 'even' "
                f"splits T evenly, 'w0' gives rank 0 a share w0 times the others' (it does no "
                f"shard reduction); red/loc = ms of one T/{world} shard's reduction / local run "
                f"on one device; err = worst relative error over ranks of the outputs, final "
                f"state and all gradients vs the one-device run, even split, tol {tol:.0e})\n\n")
        f.write(f"| family | shape | local path | err | ok | 1-dev fwd ms | "
                f"{world}-dev fwd ms even | w0 | {world}-dev fwd ms w0 | 1-dev fwd+bwd ms | {world}-dev fwd+bwd ms even | "
                f"{world}-dev fwd+bwd ms w0 | red/loc ms |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")


def write_row(res: Path, r):
    with open(res, "a") as f:
        if "error" in r:
            f.write(f"| {r['family']} | {r['shape']} | {r['path']} | error: {r['error']} |"
                    " False | | | | | | | | |\n")
        else:
            def t(base, key, i):
                if key not in r:
                    return "-"
                return f"{r[key][i]:.3f} ({r[base] / r[key][i]:.2f}x)"
            err = f"{r['err']:.1e}" if "err" in r else "-"
            f.write(f"| {r['family']} | {r['shape']} | {r['path']} | {err} | {r.get('ok', '-')} | "
                    + (f"{r['t1_fwd']:.3f} | {t('t1_fwd', 'even', 0)} | "
                       f"{r['w0']:.2f} | {t('t1_fwd', 'weighted', 0)} | " if "w0" in r else
                       f"{r['t1_fwd']:.3f} | {t('t1_fwd', 'even', 0)} | - | - | "
                       if "t1_fwd" in r else "- | - | - | - | ")
                    + (f"{r['t1_fb']:.3f} | {t('t1_fb', 'even', 1)} | {t('t1_fb', 'weighted', 1)}"
                       f" | {r['red_ms']:.3f}/{r['loc_ms']:.3f} |\n" if "t1_fb" in r else
                       "- | - | - | - |\n"))


if __name__ == "__main__":
    main()
