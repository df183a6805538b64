"""Ecosystem fit on CPU (issue 7): ``torch.compile(fullgraph=True)`` for every layer, autocast
with fp32 states, DistributedDataParallel over gloo, and the ``torch.library`` custom ops of
``lrnn_scan.compile`` (fake/meta registrations, autograd, opcheck, compile) under the Triton
interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` when there is no GPU; with a GPU the
same tests run the compiled kernels). On a GPU: ``tests/gpu/test_gpu_compile.py``."""
import datetime
import multiprocessing as mp
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import lrnn_scan.compile as lc
from lrnn_scan.models import (BDLRU, HLRU, LSTM, DeltaNet, DeltaProduct, DiagonalLRU,
                              GatedDeltaNet, GatedDeltaProduct, Mamba2)

D = 8


def _layers():
    """A small instance of every layer (the delta layers on the engine's generic scan path:
    their chunkwise torch path does not trace yet, see test_delta_chunk_mode_compile)."""
    return {
        "bdlru_m2": lambda: BDLRU(D, 8, m=2),
        "hlru_m3": lambda: HLRU(D, 4, m=3),
        "diagonal_lru": lambda: DiagonalLRU(D, 6),
        "deltanet": lambda: DeltaNet(D, 2, mode="scan"),
        "deltaproduct": lambda: DeltaProduct(D, 2, n_h=2, mode="scan"),
        "gated_deltanet": lambda: GatedDeltaNet(D, 2, mode="scan"),
        "gated_deltaproduct": lambda: GatedDeltaProduct(D, 2, mode="scan"),
        "mamba2": lambda: Mamba2(D, state_size=4),
        "lstm": lambda: LSTM(D),
    }


def _grads(layer, x, compiled=None):
    fn = layer if compiled is None else compiled
    xx = x.clone().requires_grad_(True)
    y, state = fn(xx)
    loss = (y.float() ** 2).mean() + sum(v.float().square().mean() for v in state.values())
    names = [n for n, p in layer.named_parameters()]
    g = torch.autograd.grad(loss, [xx] + [p for p in layer.parameters()])
    return y.detach(), {k: v.detach() for k, v in state.items()}, dict(zip(["x"] + names, g))


# ----------------------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("name", list(_layers()))
def test_compile_fullgraph_matches_eager(name):
    """Dynamo captures the whole layer (fullgraph=True), AOTAutograd traces its backward, and
    outputs/final states/gradients equal eager. Backend aot_eager keeps this fast on CPU; the
    Inductor variant is ``test_compile_inductor`` (slow)."""
    torch.manual_seed(0)
    layer = _layers()[name]()
    x = torch.randn(2, 7, D)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**lc.DYNAMO_OPTIONS):
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        yc, sc, gc = _grads(layer, x, compiled)
    ye, se, ge = _grads(layer, x)
    torch.testing.assert_close(yc, ye, rtol=1e-5, atol=1e-6)
    for k in se:
        torch.testing.assert_close(sc[k], se[k], rtol=1e-5, atol=1e-6)
    for k in ge:
        torch.testing.assert_close(gc[k], ge[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_layers()))
def test_compile_inductor(name):
    torch.manual_seed(0)
    layer = _layers()[name]()
    x = torch.randn(2, 7, D)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**lc.DYNAMO_OPTIONS):
        yc, sc, gc = _grads(layer, x, torch.compile(layer, fullgraph=True))
    ye, se, ge = _grads(layer, x)
    torch.testing.assert_close(yc, ye, rtol=1e-4, atol=1e-5)
    for k in ge:
        torch.testing.assert_close(gc[k], ge[k], rtol=1e-3, atol=1e-5)


def test_compile_needs_dynamo_options():
    """An operator with the generic adjoint (``TransitionOperator.param_grads``: a nested
    ``torch.autograd.grad`` inside the scan's autograd.Function, as user-defined operators get) is
    a graph break without ``trace_autograd_ops``; the built-in families' closed forms are not."""
    import lrnn_scan as ls
    from lrnn_scan.operators.base import TransitionOperator

    class GenericDiagonal(ls.Diagonal):
        param_grads = TransitionOperator.param_grads

    def f(a, b):
        return ls.scan(GenericDiagonal(a), b)
    a, b = (torch.rand(1, 3, 4, requires_grad=True) for _ in range(2))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=False), pytest.raises(Exception, match="autograd"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(a, b).sum().backward()
    torch._dynamo.reset()
    layer = HLRU(D, 4, m=2)       # Companion: closed form, no option needed
    with torch._dynamo.config.patch(trace_autograd_ops=False):
        y, _ = torch.compile(layer, fullgraph=True, backend="aot_eager")(torch.randn(1, 3, D))
    y.sum().backward()


def test_delta_chunk_mode_compile():
    """The chunkwise DeltaNet path traces without graph breaks and matches eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = DeltaNet(D, 2, mode="chunk")
    x = torch.randn(1, 5, D)
    with torch._dynamo.config.patch(**lc.DYNAMO_OPTIONS):
        y, state = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    y_ref, state_ref = layer(x)
    assert torch.allclose(y, y_ref, atol=1e-5) and torch.allclose(state["h"], state_ref["h"],
                                                                  atol=1e-5)


# ----------------------------------------------------------------------------- autocast
def _default_layers():
    """Every layer with its default options (the delta layers on their default chunkwise path)."""
    d = dict(_layers())
    d.update(deltanet=lambda: DeltaNet(D, 2), deltaproduct=lambda: DeltaProduct(D, 2, n_h=2),
             gated_deltanet=lambda: GatedDeltaNet(D, 2),
             gated_deltaproduct=lambda: GatedDeltaProduct(D, 2))
    return d


@pytest.mark.parametrize("name", list(_default_layers()))
def test_autocast_bf16_fp32_states(name):
    torch.manual_seed(0)
    layer = _default_layers()[name]()
    x = torch.randn(2, 9, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, state = layer(x)
    assert torch.isfinite(y).all()
    y.float().square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
    assert state["h"].dtype == torch.float32, state["h"].dtype


def test_autocast_gated_delta_scan_mode():
    """The generic-scan path of the gated layer under autocast: fp32 state, close to fp32 run."""
    torch.manual_seed(0)
    layer = GatedDeltaNet(D, 2, mode="scan")
    x = torch.randn(1, 4, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, state = layer(x)
    y32, _ = layer(x)
    assert state["h"].dtype == torch.float32 and torch.isfinite(y).all()
    assert (y.float() - y32).norm() <= 5e-2 * y32.norm()


# ----------------------------------------------------------------------------- DDP (gloo)
class _Stack(torch.nn.Module):
    """Residual stack of several layer families (same initialisation in every process)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.layers = torch.nn.ModuleList([BDLRU(D, 8, m=2), HLRU(D, 4, m=2), DeltaNet(D, 2),
                                           Mamba2(D, state_size=4), LSTM(D)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)[0]
        return x


def _ddp_worker(rank, world, store_path, x, out_path):
    import torch.distributed as dist
    torch.set_num_threads(1)
    # a file store, not tcp://: with TCP, rank 0 hosts the store, and a rank still tearing down
    # after rank 0 exited aborted twice in CI (exit code -6, "terminate called without an active
    # exception"), even after the barrier below
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        model = torch.nn.parallel.DistributedDataParallel(_Stack())
        local = x.chunk(world)[rank]                       # equal halves of the batch
        (model(local) ** 2).mean().backward()              # DDP averages the gradients
        if rank == 0:
            torch.save({n: p.grad for n, p in model.module.named_parameters()}, out_path)
        # both ranks reach teardown together: a rank that destroyed the group while rank 0 was
        # still saving aborted once in CI ("terminate called without an active exception", -6)
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # gloo's C++ teardown still aborted once after the barrier (CI on 533c30c, exit -6); the work
    # is done and saved, so leave without running it
    os._exit(0)


def test_ddp_gloo_matches_single_process(tmp_path):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    torch.manual_seed(0)
    x = torch.randn(4, 6, D)
    out = tmp_path / "ddp_grads.pt"
    ctx = mp.get_context("spawn")
    store = tmp_path / "store"
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, str(store), x, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
        p.join(5)
    assert not alive, "DDP workers timed out"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    ddp_grads = torch.load(out)
    model = _Stack()
    (model(x) ** 2).mean().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(ddp_grads[n], p.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{n}: {m}")


# ----------------------------------------------------------------------------- custom ops
def _interpreted() -> bool:
    try:
        from lrnn_scan.kernels.block_diagonal import fwd
    except Exception:  # noqa: BLE001
        return False
    return type(fwd._bd_fwd_kernel).__name__ == "InterpretedFunction"


needs_kernels = pytest.mark.skipif(not _interpreted() and not torch.cuda.is_available(),
                                   reason="Triton kernels neither interpreted nor on CUDA")
DEV = "cpu" if _interpreted() else "cuda"


def _cases():
    """(name, custom-op wrapper, original kernel entry point, inputs) at tiny sizes."""
    from lrnn_scan.kernels.block_diagonal import block_diagonal_scan, diagonal_scan
    from lrnn_scan.kernels.companion import companion_scan, companion_scan_coeffs
    from lrnn_scan.kernels.fused_gates import fused_gate_scan
    from lrnn_scan.delta import chunk_delta_product_triton
    g = torch.Generator().manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(DEV)

    B, T, H, m = 1, 4, 2, 2
    A = (torch.rand(B, T, H, m, m, generator=g) / m).to(DEV)
    h0 = r(B, H, m)
    q = F.normalize(r(B, T, 1, 16), dim=-1)
    k = F.normalize(r(B, T, 2, 1, 16), dim=-1)
    return [
        ("block_diagonal", lambda *a: lc.block_diagonal_scan(*a, True),
         lambda *a: block_diagonal_scan(*a, True), (A, r(B, T, H, m), h0)),
        ("diagonal", lambda *a: lc.diagonal_scan(*a, True), lambda *a: diagonal_scan(*a, True),
         (torch.rand(B, T, 3, generator=g).to(DEV), r(B, T, 3), r(B, 3))),
        # (B, N, T): the wrapper's tm_scan_fwd op and the eager path both run time_major.py
        ("diagonal_time_dim_2", lambda *a: lc.diagonal_scan(*a, True, time_dim=2),
         lambda *a: diagonal_scan(*a, True, time_dim=2),
         (torch.rand(B, 3, T, generator=g).to(DEV), r(B, 3, T), r(B, 3))),
        ("fused_gates", lambda *a: lc.fused_gate_scan(*a[:2], "softmax", 1e-6, a[2], True),
         lambda *a: fused_gate_scan(*a[:2], "softmax", 1e-6, a[2], True),
         (r(B, T, H, m, m + 1), r(B, T, H, m), h0)),
        ("companion", lambda *a: lc.companion_scan(*a[:2], "softmax", 1e-6, a[2], True),
         lambda *a: companion_scan(*a[:2], "softmax", 1e-6, a[2], True),
         (r(B, T, 3, m + 1), r(B, T, 3), r(B, 3, m))),
        ("companion_coeffs", lambda *a: lc.companion_scan_coeffs(*a, True),
         lambda *a: companion_scan_coeffs(*a, True),
         ((torch.rand(B, T, 3, m, generator=g) / m).to(DEV), r(B, T, 3), r(B, 3, m))),
        ("delta_product", lambda *a: lc.chunk_delta_product_triton(*a[:5], None, a[5], True, None, 16),
         lambda *a: chunk_delta_product_triton(*a[:5], None, a[5], True, None, 16),
         (q, k, r(B, T, 2, 1, 16), torch.rand(B, T, 2, 1, generator=g).to(DEV),
          -torch.rand(B, T, 1, generator=g).to(DEV) * 0.1, r(B, 1, 16, 16))),
    ]


def _run(fn, inputs):
    ins = [t.detach().clone().requires_grad_(True) for t in inputs]
    h, hf = fn(*ins)
    (h.float().square().sum() + hf.float().square().sum()).backward()
    return h.detach(), hf.detach(), [t.grad for t in ins]


@needs_kernels
def test_custom_ops_eager_and_compiled_match_kernels():
    """Each op (forward + registered backward) equals the kernel's own autograd Function, eagerly
    and inside ``torch.compile(fullgraph=True)``."""
    for name, ours, ref, inputs in _cases():
        h_r, f_r, g_r = _run(ref, inputs)
        torch._dynamo.reset()
        for fn in (ours, torch.compile(ours, fullgraph=True, backend="aot_eager")):
            h, f, g = _run(fn, inputs)
            torch.testing.assert_close(h, h_r, msg=lambda m: f"{name} h: {m}")
            torch.testing.assert_close(f, f_r, msg=lambda m: f"{name} final: {m}")
            for a, b in zip(g, g_r):
                torch.testing.assert_close(a, b, msg=lambda m: f"{name} grad: {m}")


@needs_kernels
def test_custom_ops_opcheck():
    ops = lc.register()
    cases = {c[0]: c[3] for c in _cases()}
    A, b, h0 = cases["block_diagonal"]
    z, v, _ = cases["fused_gates"]
    zc, vc, hc = cases["companion"]
    q, k, vd, beta, gd, hd = cases["delta_product"]
    req = lambda *ts: [t.detach().clone().requires_grad_(True) for t in ts]  # noqa: E731
    fast = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(ops["bd_scan_fwd"], (*req(A, b, h0), None, False, True))  # incl. aot_dispatch
    torch.library.opcheck(ops["fused_gate_fwd"], (*req(z, v, h0), None, 1, 0, 1e-6, torch.float32),
                          test_utils=fast)
    torch.library.opcheck(ops["companion_fwd"], (*req(zc, vc, hc), None, 1, 0, 1e-6, torch.float32),
                          test_utils=fast)
    for form in (0, 2):  # W, U stored / formed in the state kernels ("assoc", the default)
        torch.library.opcheck(ops["delta_product_fwd"], (*req(q, k, vd, beta, gd, hd), 0.25, None, 16, form),
                              test_utils=fast)
    # backward ops with non-contiguous inputs (here v, as a view of a transposed buffer, the
    # DeltaNet layer's case after its short convolution): the fakes must give the contiguous
    # strides the kernels return (Inductor asserts them; failed on an H100 on 2026-11-25)
    v_nc = vd.permute(0, 2, 3, 4, 1).contiguous().permute(0, 4, 1, 2, 3)
    q_nc = q.transpose(1, 3).contiguous().transpose(1, 3)
    assert not v_nc.is_contiguous() and not q_nc.is_contiguous()
    for form in (0, 2):
        fwd = ops["delta_product_fwd"](q_nc, k, v_nc, beta, gd, hd, 0.25, None, 16, form)
        do = torch.randn_like(fwd[0])
        torch.library.opcheck(ops["delta_product_bwd"], (q_nc, k, v_nc, beta, gd, hd, *fwd[2:], do,
                                                         torch.randn_like(fwd[1]), 0.25, None, 16, form),
                              test_utils=("test_schema", "test_faketensor"))
    y, rstd = ops["l2norm_fwd"](v_nc, 1e-12)
    torch.library.opcheck(ops["l2norm_bwd"], (v_nc, rstd, torch.randn_like(v_nc), 1e-12),
                          test_utils=("test_schema", "test_faketensor"))
    a_tm, b_tm, h_tm = cases["diagonal_time_dim_2"]
    torch.library.opcheck(ops["tm_scan_fwd"], (*req(a_tm, b_tm, h_tm), None))  # incl. aot_dispatch
    htm = ops["tm_scan_fwd"](a_tm, b_tm, h_tm, None)[0]
    torch.library.opcheck(ops["tm_scan_bwd"], (a_tm, htm, h_tm, torch.randn_like(htm), None, None),
                          test_utils=("test_schema", "test_faketensor"))
    h = ops["bd_scan_fwd"](A, b, h0, None, False, True)[0]
    torch.library.opcheck(ops["bd_scan_bwd"], (A, h, h0, torch.randn_like(h), None, None,
                                                ops["bd_scan_fwd"](A, b, h0, None, False, True)[2], False),
                          test_utils=("test_schema", "test_faketensor"))


@needs_kernels
@pytest.mark.parametrize("m,tune,want", [
    (4, dict(bd4_tma=True, tma4_bt=16, tma4_bh=2), ("tma", "tma")),      # tma_blocks(_bwd).py
    (2, dict(bd2_lookback=True, bd2_bwd_lookback=True), ("m2", True)),    # lookback2(_bwd).py
    (4, dict(bd4_lookback=True, bd4_bwd_lookback=True), ("m4", True)),    # lookback4(_bwd).py
    (2, dict(chunk=8), (False, False)),                                   # chunk products saved
    (1, dict(fwd_lookback=True, bwd_lookback=True), (True, True)),        # m = 1 look-backs
    (1, dict(fwd_lookback=False, bwd_lookback=False, chunk=8), (False, False)),
])
def test_custom_op_plans_match_eager(m, tune, want, monkeypatch):
    """The ops launch the kernels the eager functions launch (``plan.py``: before, compiled
    scans took the ring / chunked kernels only): the plan each ``scan._run_forward`` /
    ``_run_backward`` call gets, eager against compiled, with gradients and without (no
    ``requires_grad``: the inference plan), varlen, and equal outputs and gradients."""
    from lrnn_scan.kernels.block_diagonal import block_diagonal_scan
    ops = lc.register()
    mod = ops["bd_module"]
    seen = []
    for name in ("_run_forward", "_run_backward"):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name: seen.append(
            (name, a[4:8] if name == "_run_forward" else (a[6], a[8], a[9]))) or real(*a))
    g = torch.Generator().manual_seed(m)
    H = 4
    A = (torch.rand(1, 37, H, m, m, generator=g) / m).to(DEV)
    b = torch.randn(1, 37, H, m, generator=g).to(DEV)
    h0 = torch.randn(3, H, m, generator=g).to(DEV)
    cu = torch.tensor([0, 5, 21, 37], device=DEV)
    for k, v in tune.items():
        monkeypatch.setitem(mod.TUNE, k, v)
    plans = {}
    torch._dynamo.reset()
    f = torch.compile(lambda *a: lc.block_diagonal_scan(*a, True, cu), fullgraph=True, backend="aot_eager")
    for key, fn in (("eager", lambda *a: block_diagonal_scan(*a, True, cu)), ("compiled", f)):
        seen.clear()
        out = _run(fn, (A, b, h0))
        with torch.no_grad():
            fn(A, b, h0)
        plans[key] = (list(seen), out)
    assert plans["eager"][0] == plans["compiled"][0], plans
    (_, fwd), (_, bwd), _ = plans["eager"][0]
    assert (fwd[2], bwd[2]) == want and (fwd[0] == 8) == ("chunk" in tune), plans["eager"][0]
    for x, y in zip([*plans["eager"][1][:2], *plans["eager"][1][2]], [*plans["compiled"][1][:2], *plans["compiled"][1][2]]):
        torch.testing.assert_close(x, y)


@needs_kernels
def test_custom_ops_chunked_and_varlen_fake_shapes():
    """The chunked path (saved chunk products ``P``) and ``cu_seqlens`` (data-dependent number of
    chunks: an unbacked size in the fake implementation) through compile and backward."""
    from lrnn_scan.kernels.block_diagonal import block_diagonal_scan
    ops = lc.register()
    mod = ops["bd_module"]
    g = torch.Generator().manual_seed(1)
    A = (torch.rand(1, 7, 2, 2, 2, generator=g) / 2).to(DEV)
    b = torch.randn(1, 7, 2, 2, generator=g).to(DEV)
    h0 = torch.randn(2, 2, 2, generator=g).to(DEV)
    cu = torch.tensor([0, 3, 7], device=DEV)
    mod.TUNE["chunk"] = 2
    try:
        ref = _run(lambda *a: block_diagonal_scan(*a, True, cu), (A, b, h0))
        assert ops["bd_scan_fwd"](A, b, h0, cu, False, True)[2].shape[1] == 2
        torch._dynamo.reset()
        f = torch.compile(lambda *a: lc.block_diagonal_scan(*a, True, cu), fullgraph=True,
                          backend="aot_eager")
        got = _run(f, (A, b, h0))
    finally:
        mod.TUNE.pop("chunk", None)
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1])
    for a, r in zip(got[2], ref[2]):
        torch.testing.assert_close(a, r)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fA, fb, fh, fcu = (mode.from_tensor(t) for t in (A, b, h0, cu))
        h, final, P = ops["bd_scan_fwd"](fA, fb, fh, fcu, False, True)
        assert h.shape == b.shape and final.shape == (2, 2, 2) and P.dim() == 5


@needs_kernels
def test_time_major_op_varlen_compiled_without_transposes(monkeypatch):
    """``diagonal_scan(time_dim=2)`` through compile: packed ``(1, N, T_total)`` sequences with
    ``cu_seqlens``, h0 and dL/dh_T, equal to the eager kernel; the ``(B, T, N)`` op is not called
    (before the time-major ops the wrapper transposed to it and back), and bad shapes still get
    the eager function's errors."""
    from lrnn_scan.kernels.block_diagonal import diagonal_scan
    lc.register()
    g = torch.Generator().manual_seed(2)
    a = torch.rand(1, 3, 11, generator=g).to(DEV)
    b = torch.randn(1, 3, 11, generator=g).to(DEV)
    h0 = torch.randn(3, 3, generator=g).to(DEV)
    cu = torch.tensor([0, 4, 4, 11], device=DEV)
    ref = _run(lambda *x: diagonal_scan(*x, True, cu, time_dim=2), (a, b, h0))
    monkeypatch.setitem(lc._OPS, "bd_scan_fwd", None)  # a call to the (B, T, N) op would fail
    torch._dynamo.reset()
    f = torch.compile(lambda *x: lc.diagonal_scan(*x, True, cu, time_dim=2), fullgraph=True,
                      backend="aot_eager")
    for fn in (lambda *x: lc.diagonal_scan(*x, True, cu, time_dim=2), f):
        got = _run(fn, (a, b, h0))
        for x, y in zip([got[0], got[1], *got[2]], [ref[0], ref[1], *ref[2]]):
            torch.testing.assert_close(x, y)
    with pytest.raises(ValueError, match="one shape"):
        lc.diagonal_scan(a, b[..., :5].contiguous(), time_dim=2)
    with pytest.raises(ValueError, match="initial_state"):
        lc.diagonal_scan(a, b, h0[:2], False, cu, time_dim=2)


@needs_kernels
def test_engine_time_last_scan_compiled_through_tm_op(monkeypatch):
    """With ``lrnn_scan.compile.enable()`` the engine's time-last route (``scan(Diagonal(a), b,
    dim=2)`` on ``(B, N, T, 1)``) compiles with ``fullgraph=True`` through ``tm_scan_fwd`` and
    equals the eager engine in outputs and gradients."""
    import lrnn_scan as ls
    import lrnn_scan._kernel_modules as km
    if _interpreted():   # the interpreter stands in for CUDA
        monkeypatch.setattr(km, "kernel_device", lambda device: True)
    g = torch.Generator().manual_seed(3)
    a = torch.rand(2, 3, 13, 1, generator=g).to(DEV)
    b = torch.randn(2, 3, 13, 1, generator=g).to(DEV)

    def f(a, b):
        h, hf = ls.scan(ls.Diagonal(a), b, output_final_state=True, dim=2, method="kernel")
        return h, hf[..., 0]
    ref = _run(f, (a, b))
    lc.enable()
    try:
        calls, real = [], lc._OPS["tm_scan_fwd"]
        monkeypatch.setitem(lc._OPS, "tm_scan_fwd", lambda *x: calls.append(1) or real(*x))
        torch._dynamo.reset()
        got = _run(torch.compile(f, fullgraph=True, backend="aot_eager"), (a, b))
    finally:
        lc.disable()
        torch._dynamo.reset()
    assert calls
    for x, y in zip([got[0], got[1], *got[2]], [ref[0], ref[1], *ref[2]]):
        torch.testing.assert_close(x, y)


@needs_kernels
def test_enable_routes_kernel_entry_points_and_disable_restores():
    import lrnn_scan.kernels.block_diagonal as bdk
    import lrnn_scan.kernels.companion as ck
    orig = bdk.block_diagonal_scan, ck.companion_scan_coeffs
    import torch._dynamo.config as dcfg
    old = dcfg.trace_autograd_ops
    lc.enable()
    try:
        assert lc.is_enabled()
        assert bdk.block_diagonal_scan is lc.block_diagonal_scan
        assert ck.companion_scan_coeffs is lc.companion_scan_coeffs
        assert dcfg.trace_autograd_ops is True
    finally:
        lc.disable()
    assert (bdk.block_diagonal_scan, ck.companion_scan_coeffs) == orig
    assert dcfg.trace_autograd_ops == old and not lc.is_enabled()


def test_import_lrnn_scan_registers_nothing():
    code = ("import sys, torch, lrnn_scan, lrnn_scan.bench; "
            "bad = [m for m in ('lrnn_scan.compile', 'triton', 'lrnn_scan.kernels') if m in sys.modules]; "
            "ops = [o for o in ('bd_scan_fwd', 'fused_gate_fwd') if hasattr(torch.ops.lrnn_scan, o)]; "
            "print(bad, ops); sys.exit(1 if bad or ops else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def _kernel_layers():
    """The layers with a Triton path, on it (delta layers in their default chunkwise mode)."""
    d = _default_layers()
    return {k: d[k] for k in ("bdlru_m2", "hlru_m3", "diagonal_lru", "mamba2", "deltanet",
                              "deltaproduct", "gated_deltanet", "gated_deltaproduct")}


@needs_kernels
@pytest.mark.parametrize("name", list(_kernel_layers()))
def test_compile_fullgraph_layers_through_kernel_ops(name, monkeypatch):
    """The layers' kernel paths under ``torch.compile(fullgraph=True)``: routed to the Triton
    kernels (through the custom ops of :func:`lrnn_scan.compile.enable`) they trace without a
    graph break and match eager. Regression: on an H200 the engine's lazy kernel lookup
    (``importlib.import_module``) failed every kernel-backed layer's fullgraph compile. On CPU the
    tensors are routed to the interpreted kernels by patching the engine's device check."""
    _compiled_matches_eager_through_ops(_kernel_layers()[name], 7, "aot_eager", monkeypatch)


def _compiled_matches_eager_through_ops(make_layer, T, backend, monkeypatch):
    """``torch.compile(layer, fullgraph=True, backend=backend)`` against eager, both routed to the
    kernels through the custom ops (CPU: the interpreted kernels, via the patched device check):
    outputs and every gradient."""
    import lrnn_scan._kernel_modules as km
    monkeypatch.setattr(km, "kernel_device", lambda device: True)
    torch.manual_seed(0)
    layer = make_layer().to(DEV)
    x = torch.randn(2, T, D, device=DEV)
    torch._dynamo.reset()
    lc.enable()
    try:
        yc, sc, gc = _grads(layer, x, torch.compile(layer, fullgraph=True, backend=backend))
        ye, se, ge = _grads(layer, x)
    finally:
        lc.disable()
        torch._dynamo.reset()
    torch.testing.assert_close(yc, ye, rtol=1e-5, atol=1e-6)
    for k in ge:
        torch.testing.assert_close(gc[k], ge[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")


@needs_kernels
def test_compile_inductor_deltanet_through_kernel_ops(monkeypatch):
    """Inductor (not only aot_eager) checks each custom op's real output strides against its fake
    implementation. DeltaNet's ``q``, ``k``, ``v`` are views of a transposed convolution output
    (not contiguous); fakes built with ``torch.empty_like`` copied those strides while the kernels
    return contiguous gradients, and every delta layer's compiled backward failed
    ``assert_size_stride`` on an H100 (2026-11-25). Caches off: a cached graph would not see a
    changed fake."""
    import torch._functorch.config as fconf
    import torch._inductor.config as iconf

    # the config modules' own patch(): under torch 2.11 monkeypatch's set-and-restore of
    # enable_autograd_cache left later compiles in the process failing (test_l2norm's, say)
    with iconf.patch(fx_graph_cache=False), fconf.patch(enable_autograd_cache=False):
        _compiled_matches_eager_through_ops(lambda: DeltaNet(D, 2), 20, "inductor", monkeypatch)


def test_wrapper_traced_before_register_says_so():
    """A wrapper of ``lrnn_scan.compile`` traced by ``torch.compile`` before the ops exist (Dynamo
    cannot trace their definition's imports) fails with a message naming the fix (in a fresh
    process: this one has registered them)."""
    code = ("import torch, lrnn_scan.compile as lc\n"
            "f = torch.compile(lambda A, b: lc.block_diagonal_scan(A, b), fullgraph=True, backend='eager')\n"
            "try:\n    f(torch.rand(1, 3, 2, 2, 2), torch.randn(1, 3, 2, 2))\n"
            "except Exception:\n    import traceback; print(traceback.format_exc())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert "call lrnn_scan.compile.register() or enable() before torch.compile" in out.stdout, out
