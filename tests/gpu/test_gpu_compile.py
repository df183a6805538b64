"""``torch.compile(layer, fullgraph=True)`` on CUDA for every layer with its default options (the
Triton kernels reached through the ``lrnn_scan.compile`` custom ops), Inductor backend, against
eager: outputs, final states and every gradient. Skipped without a GPU."""
from __future__ import annotations

import pytest
import torch

import lrnn_scan.compile as lc
from lrnn_scan.models import (BDLRU, HLRU, LSTM, DeltaNet, DeltaProduct, DiagonalLRU,
                              GatedDeltaNet, GatedDeltaProduct, Mamba2)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

D = 64
LAYERS = {
    "bdlru_m4": lambda: BDLRU(D, 64, m=4),
    "bdlru_m1": lambda: BDLRU(D, 64, m=1),
    "hlru_m3": lambda: HLRU(D, 32, m=3),
    "diagonal_lru": lambda: DiagonalLRU(D, 64),
    "deltanet": lambda: DeltaNet(D, 2),
    "deltaproduct": lambda: DeltaProduct(D, 2, n_h=2),
    "gated_deltanet": lambda: GatedDeltaNet(D, 2),
    "gated_deltaproduct": lambda: GatedDeltaProduct(D, 2),
    "mamba2": lambda: Mamba2(D, state_size=16),
    "lstm": lambda: LSTM(D),
}


def _run(layer, fn, x):
    xx = x.clone().requires_grad_(True)
    y, state = fn(xx)
    loss = (y.float() ** 2).mean() + sum(v.float().square().mean() for v in state.values())
    params = [p for p in layer.parameters()]
    g = torch.autograd.grad(loss, [xx] + params)
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    return y.detach(), {k: v.detach() for k, v in state.items()}, dict(zip(names, g))


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).square().mean().sqrt() / (b.square().mean().sqrt() + 1e-30)).item()


@pytest.fixture(autouse=True)
def ops_registered():
    """The custom ops exist before any test traces a wrapper: Dynamo cannot trace their
    registration, and a test run alone (``-k``, pytest-xdist) has no earlier test to do it."""
    lc.register()


@pytest.fixture
def no_tf32():
    """cuDNN runs the eager LSTM with TF32 by default (allow_tf32 = True), the compiled LSTM is
    decomposed into fp32 matmuls: an H200 run saw a 2.1e-4 output difference from that alone.
    Saved and restored by hand: these switches are properties of torch's backend objects, which
    pytest 9.2's monkeypatch could not undo (it tried delattr; 9.0 could)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("name", list(LAYERS))
def test_compile_fullgraph_inductor_cuda(name, no_tf32):
    torch.manual_seed(0)
    layer = LAYERS[name]().cuda()
    x = torch.randn(2, 100, D, device="cuda")     # T = 100: not a multiple of any chunk
    torch._dynamo.reset()
    lc.enable()
    try:
        compiled = torch.compile(layer, fullgraph=True)
        yc, sc, gc = _run(layer, compiled, x)
        ye, se, ge = _run(layer, layer, x)      # eager, through the same custom ops
    finally:
        lc.disable()
        torch._dynamo.reset()
    yk, sk, gk = _run(layer, layer, x)          # eager, plain kernel path (ops not routed)
    assert _rel(yc, ye) < 1e-5 and _rel(ye, yk) < 1e-5, (_rel(yc, ye), _rel(ye, yk))
    for k in se:
        assert _rel(sc[k], se[k]) < 1e-5, (k, _rel(sc[k], se[k]))
    for k in ge:
        assert torch.isfinite(gc[k]).all(), k
        assert _rel(gc[k], ge[k]) < 1e-4, (k, _rel(gc[k], ge[k]))
        assert _rel(ge[k], gk[k]) < 1e-4, (k, _rel(ge[k], gk[k]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_time_major_diagonal_scan_inductor(dtype):
    """``diagonal_scan(time_dim=2)`` under Inductor through the ``tm_scan_fwd``/``tm_scan_bwd``
    ops, with an elementwise neighbour for Inductor to fuse around the op, against the eager
    kernel: outputs, final state, and the gradients of ``a``, ``b`` and ``h0``."""
    from lrnn_scan.kernels.block_diagonal import diagonal_scan
    torch.manual_seed(0)
    a = torch.rand(2, 96, 1001, device="cuda").to(dtype)
    b = torch.randn(2, 96, 1001, device="cuda").to(dtype)
    h0 = torch.randn(2, 96, device="cuda")

    def f(scan, a, b, h0):
        h, hf = scan(torch.sigmoid(a.float()).to(a.dtype), b, h0, True, time_dim=2)
        return h, hf

    outs = []
    for scan in (diagonal_scan, torch.compile(lambda *x, **k: lc.diagonal_scan(*x, **k), fullgraph=True)):
        ins = [t.clone().requires_grad_(True) for t in (a, b, h0)]
        h, hf = f(scan, *ins)
        (h.float().square().mean() + hf.square().mean()).backward()
        outs.append([h.detach(), hf.detach()] + [t.grad for t in ins])
    torch._dynamo.reset()
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    for x, y in zip(*outs):
        assert torch.isfinite(x).all()
        assert _rel(x, y) < tol, _rel(x, y)


@pytest.mark.parametrize("m,B,T,N", [(2, 8, 2048, 768), (4, 8, 2048, 768), (4, 4, 4096, 768),
                                     (8, 8, 2048, 768), (1, 1, 16384, 768), (16, 1, 16384, 768),
                                     (1, 8, 2048, 768)])   # m = 1 B8: the TMA backward (tma_bwd.py)
def test_compile_plans_full_size(m, B, T, N, monkeypatch):
    """At the benchmark's shapes (TMA bands, the look-backs, the ring), ``block_diagonal_scan``
    under Inductor launches what the eager function launches (``plan.py``; the plan each
    ``scan._run_forward`` / ``_run_backward`` call gets, with gradients and without), with
    equal outputs and gradients (fp32; the same kernels, so to rounding)."""
    from lrnn_scan.kernels.block_diagonal import block_diagonal_scan
    from lrnn_scan.bench.inputs import stable_blocks
    mod = lc.register()["bd_module"]
    seen = []
    for name in ("_run_forward", "_run_backward"):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name: seen.append(
            (name, a[4:8] if name == "_run_forward" else (a[6], a[8], a[9]))) or real(*a))
    g = torch.Generator(device="cuda").manual_seed(m)
    A = stable_blocks(B, T, N // m, m, m, generator=g, device="cuda")
    b = torch.randn(B, T, N // m, m, device="cuda", generator=g)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *x: lc.block_diagonal_scan(*x, None, True), fullgraph=True)
    res = {}
    for key, fn in (("eager", lambda *x: block_diagonal_scan(*x, None, True)), ("compiled", compiled)):
        seen.clear()
        ins = [A.clone().requires_grad_(True), b.clone().requires_grad_(True)]
        h, hf = fn(*ins)
        (h.square().mean() + hf.square().mean()).backward()
        with torch.no_grad():
            fn(A, b)
        res[key] = (list(seen), [h.detach(), hf.detach()] + [t.grad for t in ins])
    torch._dynamo.reset()
    assert res["eager"][0] == res["compiled"][0], (res["eager"][0], res["compiled"][0])
    for x, y in zip(res["eager"][1], res["compiled"][1]):
        assert torch.isfinite(x).all() and _rel(y, x) < 1e-5, _rel(y, x)


def _inductor_chunks_match_eager(eager, ours, z, v, calls):
    """``ours`` (a ``lrnn_scan.compile`` wrapper, ``(z, v) -> (h, h_final)``) under
    ``torch.compile(fullgraph=True)`` runs the time-chunked passes (``calls``: the
    ``chunked_calls`` list) as ``eager`` does, with equal outputs, final states and gradients."""
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True)
    res = {}
    for key, fn in (("eager", eager), ("compiled", compiled)):
        calls.clear()
        ins = [z.clone().requires_grad_(True), v.clone().requires_grad_(True)]
        h, hf = fn(*ins)
        (h.square().mean() + hf.square().mean()).backward()
        assert calls == ["chunked_forward", "chunked_backward"], (key, calls)
        res[key] = [h.detach(), hf.detach()] + [t.grad for t in ins]
    torch._dynamo.reset()
    for x, y in zip(res["eager"], res["compiled"]):
        assert torch.isfinite(x).all() and _rel(y, x) < 1e-5, _rel(y, x)


@pytest.mark.parametrize("m,T", [(4, 8193), (16, 4096)])
def test_compile_fused_gates_time_chunked(m, T, chunked_calls):
    """B1 N768 under Inductor: ``fused_gate_scan``'s custom op takes the time-chunked passes
    (``fused_gates.choose_chunk``) as the eager call does, with equal outputs and gradients."""
    from lrnn_scan.kernels.fused_gates import fused_gate_scan
    from lrnn_scan.kernels.fused_gates import function as ff
    calls = chunked_calls(ff)
    g = torch.Generator(device="cuda").manual_seed(m)
    z = torch.randn(1, T, 768 // m, m, m + 1, device="cuda", generator=g)
    v = torch.randn(1, T, 768 // m, m, device="cuda", generator=g)
    _inductor_chunks_match_eager(lambda z, v: fused_gate_scan(z, v, "softmax", 1e-6, None, True),
                                 lambda z, v: lc.fused_gate_scan(z, v, "softmax", 1e-6, None, True),
                                 z, v, calls)


@pytest.mark.parametrize("m,T,coeffs", [(4, 4097, False), (8, 4097, True)])
def test_compile_companion_time_chunked(m, T, coeffs, chunked_calls):
    """B1 N768 under Inductor: the companion op (``lrnn_scan/_compile_companion.py``) takes the
    time-chunked passes (``companion.choose_chunk``) as the eager call does, with equal outputs
    and gradients."""
    from lrnn_scan.kernels.companion import companion_scan, companion_scan_coeffs
    from lrnn_scan.kernels.companion import function as cf
    calls = chunked_calls(cf)
    g = torch.Generator(device="cuda").manual_seed(m)
    z = (torch.rand(1, T, 768, m, device="cuda", generator=g) / m if coeffs
         else torch.randn(1, T, 768, m + 1, device="cuda", generator=g))
    v = torch.randn(1, T, 768, device="cuda", generator=g)
    if coeffs:
        eager, ours = companion_scan_coeffs, lc.companion_scan_coeffs
    else:
        eager = lambda z, v, s, f: companion_scan(z, v, "softmax", 1e-6, s, f)  # noqa: E731
        ours = lambda z, v, s, f: lc.companion_scan(z, v, "softmax", 1e-6, s, f)  # noqa: E731
    _inductor_chunks_match_eager(lambda z, v: eager(z, v, None, True), lambda z, v: ours(z, v, None, True),
                                 z, v, calls)
