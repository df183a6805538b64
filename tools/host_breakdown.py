"""Where the host time of an eager scan call goes (CUDA): raw launch costs against one call.

Host time per call = wall time of n back-to-back calls at T = 16 (negligible GPU work) with one
synchronize at the end. Rows:

* ``launch:*``: one Triton launch of our m = 1 forward tile kernel through ``kernel[grid](...)``
  (the binder and cache lookup of ``JITFunction.run``) and through the compiled kernel's own
  ``run`` (what remains without the binder), an empty Triton kernel, ``torch.empty`` /
  ``torch.zeros`` / ``torch.cat`` on CUDA;
* ``ours:*`` / ``accel:*``: ``diagonal_scan`` / ``block_diagonal_scan`` forward and forward +
  backward (``torch.autograd.grad``), and accelerated-scan's Triton scan (if installed);
* ``traced``: inclusive times of chosen functions inside one call (cProfile's view of the same
  calls: ``tools/host_overhead.py --profile``).

    python tools/host_breakdown.py [--m 1 2 4 8]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lrnn_scan.kernels.block_diagonal import scan as S  # noqa: E402
from lrnn_scan.kernels.block_diagonal.fwd import _diag_fwd_kernel  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_overhead import _case as _scan_case, _loop_us  # noqa: E402  (same inputs, calls, loop)


@triton.jit
def _empty_kernel(x_ptr, n):
    pass


def _us(fn, n=200, rounds=5):
    """Median over ``rounds`` of ``host_overhead._loop_us`` (wall time per call of ``n``
    back-to-back calls, one synchronize): the host cost where the GPU work is negligible."""
    return statistics.median(_loop_us(fn, n) for _ in range(rounds))


def _diag_launch(B=8, T=16, N=768):
    a, b = torch.rand(B, T, N, device="cuda"), torch.randn(B, T, N, device="cuda")
    h, final = torch.empty_like(b), torch.empty(B, N, device="cuda")
    bt, bn, nw, _ = S._diag_cfg(N, B, b.device)
    grid = (triton.cdiv(N, bn), B, 1)
    args = (a, b, h, b, final, b, b, T, N, T, 1)
    kw = dict(BT=bt, BN=bn, HAS_INIT=False, STORE_H=True, STORE_FINAL=True, STORE_P=False,
              VARLEN=False, num_warps=nw)
    k = _diag_fwd_kernel[grid](*args, **kw)
    return (lambda: _diag_fwd_kernel[grid](*args, **kw)), k, grid, args, kw


def _direct(k, grid, args, kw):
    """The compiled kernel's launcher without the binder (Triton 3.6's ``JITFunction.run`` tail);
    None where this Triton's ``CompiledKernel`` differs."""
    from triton.runtime import driver
    from triton import knobs
    try:
        dev = driver.active.get_current_device()
        stream = driver.active.get_current_stream(dev)
        binder = _diag_fwd_kernel.device_caches[dev][4]
        vals = list(binder(*args, **kw)[0].values())  # every parameter, constexprs included
        meta = k.launch_metadata(grid, stream, *vals)

        def go():
            k.run(grid[0], grid[1], grid[2], stream, k.function, k.packed_metadata, meta,
                  knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *vals)
        go()
        torch.cuda.synchronize()
        return go
    except Exception as e:  # measurement only
        print(f"direct launch not measured: {e!r}")
        return None


def _accel_case(B, T, N, grad):
    try:
        from accelerated_scan.scalar import scan
    except Exception as e:
        print(f"accelerated-scan not available: {e!r}")
        return None
    a = torch.rand(B, N, T, device="cuda").requires_grad_(grad)
    b = torch.randn(B, N, T, device="cuda").requires_grad_(grad)
    g = torch.randn_like(b)
    if grad:
        return lambda: torch.autograd.grad(scan(a, b), (a, b), g)
    return lambda: scan(a, b)


class _Nop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _parts():
    """The pieces of ``diagonal_scan``'s forward, each timed alone (no profiler)."""
    from lrnn_scan.kernels.block_diagonal import checks, plan, tma
    from triton.tools.tensor_descriptor import TensorDescriptor
    B, T, N = 8, 16, 768
    a, b = torch.rand(B, T, N, device="cuda"), torch.randn(B, T, N, device="cuda")
    dev, sms = b.device, S._num_sms(b.device)
    cfg = tma.tma_config(a, b, B, S.TUNE, sms)
    rows = [("_check_float", _us(lambda: checks._check_float("a", a, 3, "(B, T, N)"))),
            ("_check_common", _us(lambda: checks._check_common(b, "b", B, T, (N,), None, None))),
            ("diag_plan (fwd)", _us(lambda: plan.diag_plan(b, B, T, False))),
            ("diag_plan (grad)", _us(lambda: plan.diag_plan(b, B, T, True))),
            ("tma_config", _us(lambda: tma.tma_config(a, b, B, S.TUNE, sms))),
            ("_empty (B, T, N)", _us(lambda: S._empty(b.shape, b.dtype, dev))),
            ("_needs_grad", _us(lambda: S._needs_grad(a, b, None))),
            ("autograd.Function.apply (view)", _us(lambda: _Nop.apply(b)))]
    x, g = b.clone().requires_grad_(True), torch.randn_like(b)
    rows.append(("autograd.grad through a view Function", _us(lambda: torch.autograd.grad(_Nop.apply(x), x, g))))
    h = S.diagonal_scan(a, b)[0]
    rows.append(("_run_backward (m = 1, one pass)", _us(
        lambda: S._run_backward(a, h, None, g, None, None, None, None, True, False, T))))
    if cfg is None:
        return rows + [("TMA not chosen here", 0.0)]
    bt, bn, nw, ns = cfg

    def desc(t):
        return TensorDescriptor(t, shape=[B, T, N], strides=[T * N, N, 1], block_shape=[1, bt, bn])
    da, db, h, final = desc(a), desc(b), torch.empty_like(b), torch.empty(B, N, device="cuda")
    kw = dict(BT=bt, BN=bn, NS=ns, HAS_INIT=False, VARLEN=False, num_warps=nw)
    grid = (triton.cdiv(N, bn), B)
    rows += [("TensorDescriptor x2", _us(lambda: (desc(a), desc(b)))),
             ("TMA kernel[grid](prebuilt descriptors)",
              _us(lambda: tma._diag_fwd_tma_kernel[grid](da, db, h, b, final, b, T, N, **kw))),
             ("diag_tma_forward", _us(lambda: tma.diag_tma_forward(a, b, None, None, cfg, S._empty))),
             ("_diag_apply", _us(lambda: S._diag_apply(a, b, None, None, B, T))),
             ("diagonal_scan", _us(lambda: S.diagonal_scan(a, b)))]
    with S.tuned({"diag_tma": False}):
        rows.append(("diagonal_scan, TUNE diag_tma False", _us(lambda: S.diagonal_scan(a, b))))
    return rows


def _trace(fn, n=2000):
    """Inclusive host time per call of chosen functions inside ``fn`` (wrappers with two clock
    reads each, instead of a profiler's hook on every Python call)."""
    from collections import defaultdict
    from triton.runtime.jit import JITFunction
    from lrnn_scan.kernels.block_diagonal import plan, tma, tma_blocks, tma_blocks_bwd
    acc, cnt, undo = defaultdict(float), defaultdict(int), []

    def wrap(owner, attr, label, static=False):
        orig = owner.__dict__[attr]
        f = orig.__func__ if static else orig

        def w(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                acc[label] += time.perf_counter() - t
                cnt[label] += 1
        setattr(owner, attr, staticmethod(w) if static else w)
        undo.append((owner, attr, orig))
    wrap(JITFunction, "run", "JITFunction.run (launches)")
    for mod, names in ((S, ["_empty", "_check_float", "_check_common", "_run_forward", "_run_backward",
                            "_diag_forward", "_diag_backward", "_bd_forward", "_bd_backward",
                            "_diag_cfg", "_choose_chunk", "_needs_grad"]),
                       (plan, ["diag_plan", "bd_plan"]),
                       (tma, ["diag_tma_forward", "tma_config", "TensorDescriptor"]),
                       (tma_blocks, ["bd_tma_forward", "bd_tma_config", "TensorDescriptor"]),
                       (tma_blocks_bwd, ["bd_tma_backward", "TensorDescriptor"])):
        for name in names:
            if name in mod.__dict__:
                wrap(mod, name, f"{mod.__name__.rsplit('.', 1)[-1]}.{name}")
    wrap(S._ScanFn, "forward", "_ScanFn.forward", static=True)
    wrap(S._ScanFn, "backward", "_ScanFn.backward", static=True)
    try:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        acc.clear()
        cnt.clear()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        total = (time.perf_counter() - t) / n * 1e6
    finally:
        for owner, attr, orig in reversed(undo):
            setattr(owner, attr, orig)
    rows = [("(whole call)", total, 1.0)]
    rows += sorted(((k, v / n * 1e6, cnt[k] / n) for k, v in acc.items()), key=lambda r: -r[1])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8])
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          f"lrnn_scan kernels from {Path(S.__file__).parent}")
    rows = []
    launch, k, grid, args, kw = _diag_launch()
    rows.append(("launch: _diag_fwd_kernel[grid](...)", _us(launch)))
    go = _direct(k, grid, args, kw)
    if go is not None:
        rows.append(("launch: compiled.run (no binder)", _us(go)))
    x = torch.empty(16, device="cuda")
    _empty_kernel[(1,)](x, 16)
    rows.append(("launch: empty kernel[grid](x, n)", _us(lambda: _empty_kernel[(1,)](x, 16))))
    rows.append(("torch.empty (8, 16, 768)", _us(lambda: torch.empty(8, 16, 768, device="cuda"))))
    rows.append(("torch.zeros (8, 768)", _us(lambda: torch.zeros(8, 768, device="cuda"))))
    y = torch.randn(8, 4, 768, device="cuda")
    rows.append(("torch.cat 2 x (8, 2, 768)", _us(lambda: torch.cat([y[:, :2], y[:, 2:]], 1))))
    for m in a.m:
        for grad in (False, True):
            rows.append((f"ours: m={m} {'fwd+bwd' if grad else 'fwd'} B8 T16 N768",
                         _us(_scan_case(8, 16, 768, m, grad))))
    for grad in (False, True):
        fn = _accel_case(8, 16, 768, grad)
        if fn is not None:
            rows.append((f"accel: {'fwd+bwd' if grad else 'fwd'} B8 T16 N768", _us(fn)))
    for m in (1, 4):
        for grad in (False, True):
            rows.append((f"ours: m={m} {'fwd+bwd' if grad else 'fwd'} B1 T16384 N768 (loop)",
                         _us(_scan_case(1, 16384, 768, m, grad), 50)))
    print("| case | us per call |\n|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")
    print("\n| part (m = 1 forward, B8 T16 N768) | us per call |\n|---|---|")
    for name, us in _parts():
        print(f"| {name} | {us:.1f} |")
    for m, grad in ((1, False), (1, True), (4, False), (4, True)):
        print(f"\n| traced m = {m} {'fwd+bwd' if grad else 'fwd'} B8 T16 N768 | inclusive us per call | calls per call |"
              "\n|---|---|---|")
        for name, us, c in _trace(_scan_case(8, 16, 768, m, grad)):
            print(f"| {name} | {us:.1f} | {c:g} |")


if __name__ == "__main__":
    main()
