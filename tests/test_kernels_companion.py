"""Companion (H-LRU) scans (``kernels.companion``) under the Triton interpreter vs an fp64
sequential reference: outputs, final shift registers, all gradients (logits / a, v / b, h0)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
os.environ["LRNN_SCAN_POISON"] = "1"  # outputs start as NaN: every element must be written

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from lrnn_scan.kernels.companion import (companion_scan, companion_scan_coeffs,  # noqa: E402
                                         companion_scan_coeffs_ref, companion_scan_ref)
from lrnn_scan.gates import normalize_gates  # noqa: E402

_kmod = sys.modules[companion_scan.__module__]
# Triton fixes interpreter mode when a kernel is decorated: if another module imported these
# kernels first on a CUDA machine, they are compiled kernels and this file runs them on the GPU.
INTERPRETED = type(_kmod.companion_fwd_kernel).__name__ == "InterpretedFunction"
DEV = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="kernels were compiled for CUDA but no GPU is present")

VARIANTS = ["softmax", "sigmoid", "relu", "tanh", "identity", "none"]


def rel(a, b):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    assert torch.isfinite(a).all(), "non-finite values: an output element was not written"
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def run_case(B, T, N, m, variant="softmax", dtype=torch.float32, h0=True, cu=None, final=True,
             seed=0, tol=2e-5):
    """variant "coeffs" tests companion_scan_coeffs (materialised a, b)."""
    g = torch.Generator().manual_seed(seed)
    coeffs = variant == "coeffs"
    if coeffs:
        z = (torch.rand(B, T, N, m, generator=g) * 2 - 1) / m
    else:
        z = torch.randn(B, T, N, m + 1, generator=g) * (0.3 if variant == "none" else 1.5)
    z = z.to(dtype)
    v = torch.randn(B, T, N, generator=g).to(dtype)
    ns = B if cu is None else len(cu) - 1
    s0 = torch.randn(ns, N, m, generator=g) if h0 else None
    cuk = None if cu is None else torch.tensor(cu, dtype=torch.int64)
    cud = None if cu is None else cuk.to(DEV)
    z, v = z.to(DEV), v.to(DEV)
    s0 = s0.to(DEV) if h0 else None
    xs = [z.requires_grad_(), v.requires_grad_()] + ([s0.requires_grad_()] if h0 else [])
    if coeffs:
        h, hf = companion_scan_coeffs(z, v, initial_state=s0, output_final_state=final, cu_seqlens=cud)
    else:
        h, hf = companion_scan(z, v, variant, initial_state=s0, output_final_state=final,
                               cu_seqlens=cud)
    assert h.shape == v.shape and h.dtype == torch.promote_types(z.dtype, v.dtype)
    assert (hf is not None) == final
    gh = torch.randn(h.shape, generator=g).to(DEV, h.dtype)
    loss = (h * gh).sum()
    if final:
        assert hf.dtype == torch.float32 and hf.shape == (ns, N, m)
        ghf = torch.randn(hf.shape, generator=g).to(DEV)
        loss = loss + (hf * ghf).sum()
    grads = torch.autograd.grad(loss, xs)
    assert [g_.dtype for g_ in grads] == [x.dtype for x in xs], "gradients in the inputs' dtypes"
    rx = [x.detach().cpu().double().requires_grad_() for x in xs]
    kw = dict(initial_state=rx[2] if h0 else None, output_final_state=final, cu_seqlens=cuk)
    hr, hfr = (companion_scan_coeffs_ref(rx[0], rx[1], **kw) if coeffs
               else companion_scan_ref(rx[0], rx[1], variant, **kw))
    lr = (hr * gh.cpu().double()).sum() + ((hfr.double() * ghf.cpu().double()).sum() if final else 0)
    rgrads = torch.autograd.grad(lr, rx)
    errs = {"h": rel(h, hr)}
    if final:
        errs["h_final"] = rel(hf, hfr)
    for name, a, b in zip(["d_logits", "d_v", "d_h0"], grads, rgrads):
        errs[name] = rel(a, b)
    assert max(errs.values()) < tol, errs


@pytest.mark.parametrize("variant", VARIANTS + ["coeffs"])
def test_every_variant(variant):
    run_case(2, 17, 5, 3, variant, seed=1)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_orders(m):
    run_case(1, 17, 6, m, "softmax", seed=m)


@pytest.mark.parametrize("T", [1, 64, 129])
def test_lengths(T):
    run_case(1, T, 3, 2, "coeffs" if T == 129 else "sigmoid", seed=T, final=T != 64, h0=T != 1)


def test_shorter_than_order():
    # T < m: the final register still holds part of the initial state
    run_case(2, 3, 4, 8, "tanh", seed=3)


def test_varlen_with_states():
    run_case(1, 40, 5, 3, "relu", cu=[0, 1, 2, 13, 13, 30, 40], seed=4)


def test_varlen_coeffs():
    run_case(1, 30, 3, 4, "coeffs", cu=[0, 7, 8, 30, 30], seed=5)  # empty last sequence


@pytest.mark.parametrize("upcast16", [True, False])
def test_bf16_inputs_fp32_state(upcast16, monkeypatch):
    # default: 16-bit inputs read as fp32 copies (2-byte loads are not pipelined); both paths
    monkeypatch.setitem(_kmod.TUNE, "upcast16", upcast16)
    run_case(1, 17, 8, 4, "softmax", dtype=torch.bfloat16, seed=6, tol=2e-2)


@pytest.mark.parametrize("m,T,chunk,variant", [(1, 19, 4, "softmax"), (2, 63, 8, "tanh"),
                                               (3, 65, 16, "sigmoid"), (4, 37, 5, "coeffs"),
                                               (8, 25, 2, "softmax"), (5, 12, 7, "relu")])
def test_time_chunked(m, T, chunk, variant, monkeypatch, chunked_calls):
    """The time-chunked passes (chunked.py: summaries of m + 1 columns, carries, re-run; the
    adjoint likewise), forced by TUNE["chunk"]: chunks that do not divide T, chunks shorter than
    the order m (their history reaches into earlier chunks), logits and coefficients."""
    monkeypatch.setitem(_kmod.TUNE, "chunk", chunk)
    calls = chunked_calls(_kmod)
    run_case(2, T, 3, m, variant, seed=20 + m)
    run_case(1, T, 2, m, variant, seed=30 + m, h0=False, final=False)
    assert calls == ["chunked_forward", "chunked_backward"] * 2


@pytest.mark.parametrize("m,chunk,unroll", [(3, 10, False), (4, 16, True), (16, 40, True)])
def test_time_chunked_summary_loops(m, chunk, unroll, monkeypatch):
    """The summary pass's two loops (chunked.summary_config): ``m`` steps a trip with constant
    slots (several trips, and a tail where ``m`` does not divide the chunk) and one step a trip
    with the slot a runtime value."""
    monkeypatch.setitem(_kmod.TUNE, "chunk", chunk)
    monkeypatch.setitem(_kmod.TUNE, "sum_unroll", unroll)
    run_case(1, 97, 3, m, "coeffs" if m == 4 else "softmax", seed=40 + m)


@pytest.mark.parametrize("m,unroll,chunk", [(12, None, None), (5, 0, None), (5, 1, None),
                                            (6, 0, 9), (3, 1, 8)])
def test_one_pass_loops_unrolled_or_not(m, unroll, chunk, monkeypatch):
    """The forward and backward loops with ``m`` steps a trip (constant slots; a prologue before
    the first step that is 0 mod m, a tail) and with one step a trip: ``function._unrolled``
    keeps one step a trip for the backward from logits above m = 8 (m = 12 here, its forward
    unrolled); ``TUNE["unroll"]`` forces either, also in time chunks that start off the m grid."""
    if unroll is not None:
        monkeypatch.setitem(_kmod.TUNE, "unroll", unroll)
    if chunk is not None:
        monkeypatch.setitem(_kmod.TUNE, "chunk", chunk)
    run_case(2, 41, 3, m, "softmax", seed=50 + m)
    run_case(1, 30, 2, m, "coeffs", seed=60 + m, h0=False)


def test_time_chunked_varlen(monkeypatch, chunked_calls):
    """Chunked varlen: boundaries inside chunks, an empty sequence, one shorter than a chunk."""
    monkeypatch.setitem(_kmod.TUNE, "chunk", 6)
    calls = chunked_calls(_kmod)
    run_case(1, 41, 2, 3, "sigmoid", cu=[0, 4, 4, 23, 41], seed=21)
    run_case(1, 41, 2, 2, "coeffs", cu=[0, 4, 4, 23, 41], seed=22)
    assert calls == ["chunked_forward", "chunked_backward"] * 2


def test_time_chunked_varlen_shorter_than_a_chunk(monkeypatch, chunked_calls):
    monkeypatch.setitem(_kmod.TUNE, "chunk", 64)
    calls = chunked_calls(_kmod)
    run_case(1, 20, 2, 3, "softmax", cu=[0, 7, 20], seed=24)
    assert calls == []


def test_time_chunked_bf16(monkeypatch):
    monkeypatch.setitem(_kmod.TUNE, "chunk", 7)
    run_case(1, 30, 2, 4, "softmax", dtype=torch.bfloat16, seed=23, tol=2e-2)


@pytest.mark.parametrize("coeffs", [False, True])
def test_compiled_op_time_chunked_matches_eager(coeffs, monkeypatch, chunked_calls,
                                                compiled_chunks_match_eager):
    """The ``lrnn_scan.compile`` companion op (``lrnn_scan/_compile_companion.py``) with time
    chunks (forced, ``TUNE["chunk"]``) runs the chunked passes as eager does: equal outputs, final
    states and gradients, directly and under ``torch.compile(fullgraph=True)``; opcheck while it
    chunks (its third output ``PT``, a dynamic chunk count in the fake)."""
    import lrnn_scan.compile as lc
    monkeypatch.setitem(_kmod.TUNE, "chunk", 3)
    calls = chunked_calls(_kmod)
    g = torch.Generator().manual_seed(4)
    m = 3
    z = torch.rand(1, 8, 2, m, generator=g) / m if coeffs else torch.randn(1, 8, 2, m + 1, generator=g)
    xs = [z.to(DEV), torch.randn(1, 8, 2, generator=g).to(DEV), torch.randn(1, 2, m, generator=g).to(DEV)]
    if coeffs:
        eager = lambda a, b, s: companion_scan_coeffs(a, b, s, True)  # noqa: E731
        ours = lambda a, b, s: lc.companion_scan_coeffs(a, b, s, True)  # noqa: E731
    else:
        eager = lambda z, v, s: companion_scan(z, v, "softmax", 1e-6, s, True)  # noqa: E731
        ours = lambda z, v, s: lc.companion_scan(z, v, "softmax", 1e-6, s, True)  # noqa: E731
    compiled_chunks_match_eager(eager, ours, xs, calls)
    req = [t.detach().clone().requires_grad_(True) for t in xs]
    col0, code, eps = (0, 5, 1.0) if coeffs else (1, 0, 1e-6)
    torch.library.opcheck(lc.register()["companion_fwd"], (*req, None, col0, code, eps, torch.float32),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_no_state_no_final():
    run_case(2, 9, 3, 2, "identity", h0=False, final=False, seed=7)


def test_matches_companion_matrix():
    # the shift-register / companion-matrix form of math.md §2
    g = torch.Generator().manual_seed(8)
    a = torch.randn(1, 7, 2, 3, generator=g, dtype=torch.float64) / 3
    b = torch.randn(1, 7, 2, generator=g, dtype=torch.float64)
    s0 = torch.randn(1, 2, 3, generator=g, dtype=torch.float64)
    h, hf = companion_scan_coeffs_ref(a, b, initial_state=s0, output_final_state=True)
    s = s0[0].clone()
    for t in range(7):
        C = torch.zeros(2, 3, 3, dtype=torch.float64)
        C[:, 0, :] = a[0, t]
        C[:, 1, 0] = C[:, 2, 1] = 1
        s = (C @ s[..., None])[..., 0]
        s[:, 0] += b[0, t]
        assert rel(h[0, t], s[:, 0]) < 1e-14
    assert rel(hf[0], s) < 1e-6


def test_reference_uses_normalize_gates():
    g = torch.Generator().manual_seed(9)
    z = torch.randn(1, 5, 3, 3, generator=g, dtype=torch.float64)
    v = torch.randn(1, 5, 3, generator=g, dtype=torch.float64)
    a, a0 = normalize_gates(z, "sigmoid")
    h1, _ = companion_scan_ref(z, v, "sigmoid")
    h2, _ = companion_scan_coeffs_ref(a, a0 * v)
    assert rel(h1, h2) < 1e-14


@pytest.mark.parametrize("bad, exc, word", [
    (dict(logits=torch.zeros(1, 4, 3)), ValueError, "logits"),
    (dict(logits=torch.zeros(1, 4, 2, 3, dtype=torch.int32)), TypeError, "logits"),
    (dict(v=torch.zeros(1, 4, 3)), ValueError, "logits"),
    (dict(variant="cubic"), ValueError, "variant"),
    (dict(eps=-1.0), ValueError, "eps"),
    (dict(initial_state=torch.zeros(1, 2, 3)), ValueError, "initial_state"),
    (dict(cu_seqlens=torch.tensor([[0, 4]])), ValueError, "cu_seqlens"),
])
def test_bad_arguments(bad, exc, word):
    args = dict(logits=torch.zeros(1, 4, 2, 3), v=torch.zeros(1, 4, 2))
    args.update(bad)
    with pytest.raises(exc, match=word):
        companion_scan(**args)


def test_bad_coeff_arguments():
    with pytest.raises(ValueError, match="a must have shape"):
        companion_scan_coeffs(torch.zeros(1, 4, 3, 2), torch.zeros(1, 4, 2))
    with pytest.raises(TypeError, match="b must"):
        companion_scan_coeffs(torch.zeros(1, 4, 2, 2), None)


def test_empty_time():
    s0 = torch.randn(1, 2, 3).to(DEV).requires_grad_()
    h, hf = companion_scan(torch.zeros(1, 0, 2, 4).to(DEV), torch.zeros(1, 0, 2).to(DEV),
                           initial_state=s0, output_final_state=True)
    assert h.shape == (1, 0, 2) and rel(hf, s0) == 0
    w = torch.arange(6.0).view(1, 2, 3).to(DEV)
    (g,) = torch.autograd.grad((hf * w).sum(), [s0])
    assert rel(g, w) == 0
