"""Fused-gate block-diagonal scan (``kernels.fused_gates``) under the Triton interpreter vs an fp64
sequential reference (``normalize_gates`` + a plain loop): outputs, final states, all gradients."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
os.environ["LRNN_SCAN_POISON"] = "1"  # outputs start as NaN: every element must be written

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from lrnn_scan.kernels.fused_gates import (fused_gate_scan, fused_gate_scan_ref,  # noqa: E402
                                           materialized_block_scan, block_scan_ref)
from lrnn_scan.gates import normalize_gates  # noqa: E402

_kmod = sys.modules[fused_gate_scan.__module__]
# Triton fixes interpreter mode when a kernel is decorated: if another module imported these
# kernels first on a CUDA machine, they are compiled kernels and this file runs them on the GPU.
INTERPRETED = type(_kmod.block_scan_fwd_kernel).__name__ == "InterpretedFunction"
DEV = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="kernels were compiled for CUDA but no GPU is present")

VARIANTS = ["softmax", "sigmoid", "relu", "tanh", "identity", "none"]


def rel(a, b):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    assert torch.isfinite(a).all(), "non-finite values: an output element was not written"
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def run_case(B, T, H, m, variant="softmax", dtype=torch.float32, h0=True, cu=None, final=True,
             seed=0, tol=2e-5):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(B, T, H, m, m + 1, generator=g) * (0.3 if variant == "none" else 1.5)).to(dtype)
    v = torch.randn(B, T, H, m, generator=g).to(dtype)
    ns = B if cu is None else len(cu) - 1
    s0 = torch.randn(ns, H, m, generator=g) if h0 else None
    cuk = None if cu is None else torch.tensor(cu, dtype=torch.int64)
    cud = None if cu is None else cuk.to(DEV)
    z, v = z.to(DEV), v.to(DEV)
    s0 = s0.to(DEV) if h0 else None
    xs = [z.requires_grad_(), v.requires_grad_()] + ([s0.requires_grad_()] if h0 else [])
    h, hf = fused_gate_scan(z, v, variant, initial_state=s0, output_final_state=final,
                            cu_seqlens=cud)
    assert h.shape == v.shape and h.dtype == torch.promote_types(z.dtype, v.dtype)
    assert (hf is not None) == final
    gh = torch.randn(h.shape, generator=g).to(DEV, h.dtype)
    loss = (h * gh).sum()
    if final:
        assert hf.dtype == torch.float32 and hf.shape == (ns, H, m)
        ghf = torch.randn(hf.shape, generator=g).to(DEV)
        loss = loss + (hf * ghf).sum()
    grads = torch.autograd.grad(loss, xs)
    assert [g_.dtype for g_ in grads] == [x.dtype for x in xs], "gradients in the inputs' dtypes"
    ref_xs = [x.detach().cpu().double().requires_grad_() for x in xs]
    hr, hfr = fused_gate_scan_ref(ref_xs[0], ref_xs[1], variant, initial_state=ref_xs[2] if h0 else None,
                                  output_final_state=final, cu_seqlens=cuk)
    lr = (hr * gh.cpu().double()).sum() + ((hfr.double() * ghf.cpu().double()).sum() if final else 0)
    rgrads = torch.autograd.grad(lr, ref_xs)
    errs = {"h": rel(h, hr)}
    if final:
        errs["h_final"] = rel(hf, hfr)
    for name, a, b in zip(["d_logits", "d_v", "d_h0"], grads, rgrads):
        errs[name] = rel(a, b)
    assert max(errs.values()) < tol, errs


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant(variant):
    run_case(2, 17, 3, 3, variant, seed=1)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_block_sizes(m):
    run_case(1, 17, 2, m, "softmax", seed=m)


@pytest.mark.parametrize("T", [1, 64, 129])
def test_lengths(T):
    run_case(1, T, 2, 2, "sigmoid", seed=T, final=T != 64, h0=T != 1)


def test_m16_tanh():
    run_case(1, 5, 1, 16, "tanh", seed=3)


def test_varlen_with_states():
    # boundaries at odd places, an empty and a length-1 sequence
    run_case(1, 40, 2, 3, "relu", cu=[0, 1, 13, 13, 30, 40, 40], seed=4)


@pytest.mark.parametrize("upcast16", [True, False])
def test_bf16_inputs_fp32_state(upcast16, monkeypatch):
    # default: 16-bit inputs read as fp32 copies (2-byte loads are not pipelined); both paths
    monkeypatch.setitem(_kmod.TUNE, "upcast16", upcast16)
    run_case(1, 17, 2, 4, "softmax", dtype=torch.bfloat16, seed=5, tol=2e-2)


@pytest.mark.parametrize("m,T,chunk", [(1, 17, 4), (2, 63, 8), (3, 65, 16), (4, 37, 5),
                                       (8, 20, 6), (16, 9, 2)])
def test_time_chunked(m, T, chunk, monkeypatch, chunked_calls):
    """The time-chunked passes (chunked.py: chunk summaries, carries, re-run; the adjoint's the
    same in reverse), forced by TUNE["chunk"]: chunks that do not divide T, a last chunk of one
    step, every block size class."""
    monkeypatch.setitem(_kmod.TUNE, "chunk", chunk)
    calls = chunked_calls(_kmod)
    run_case(2, T, 2, m, "softmax" if m % 2 else "tanh", seed=10 + m)
    assert calls == ["chunked_forward", "chunked_backward"]


@pytest.mark.parametrize("variant", ["sigmoid", "relu", "identity", "none"])
def test_time_chunked_varlen(variant, monkeypatch, chunked_calls):
    """Chunked varlen: boundaries inside chunks, an empty sequence and one shorter than a chunk
    (its later chunks are empty: P = I, E = 0), no initial state for one variant."""
    monkeypatch.setitem(_kmod.TUNE, "chunk", 6)
    calls = chunked_calls(_kmod)
    run_case(1, 41, 2, 3, variant, cu=[0, 4, 4, 23, 41], seed=11, h0=variant != "none",
             final=variant != "relu")
    assert calls == ["chunked_forward", "chunked_backward"]


def test_time_chunked_varlen_shorter_than_a_chunk(monkeypatch, chunked_calls):
    """Forced chunks longer than every sequence: one pass."""
    monkeypatch.setitem(_kmod.TUNE, "chunk", 64)
    calls = chunked_calls(_kmod)
    run_case(1, 20, 2, 2, "softmax", cu=[0, 7, 20], seed=14)
    assert calls == []


def test_time_chunked_bf16(monkeypatch):
    monkeypatch.setitem(_kmod.TUNE, "chunk", 7)
    run_case(1, 30, 2, 4, "softmax", dtype=torch.bfloat16, seed=12, tol=2e-2)


def test_time_chunked_column_groups(monkeypatch):
    """Chunk summaries with several programs a block (``sum_ncb`` columns of ``P`` each); the
    default m = 16 / 32 summaries (``tl.dot``) run in ``test_time_chunked``."""
    monkeypatch.setitem(_kmod.TUNE, "chunk", 5)
    monkeypatch.setitem(_kmod.TUNE, "sum_ncb", 2)
    run_case(1, 12, 1, 8, "softmax", seed=13)
    monkeypatch.setitem(_kmod.TUNE, "sum_dot", False)  # m = 16 by broadcast products too
    monkeypatch.setitem(_kmod.TUNE, "sum_ncb", 4)
    run_case(1, 7, 1, 16, "tanh", seed=13)
    monkeypatch.setitem(_kmod.TUNE, "sum_ncb", 3)
    with pytest.raises(ValueError, match="sum_ncb"):
        run_case(1, 12, 1, 8, "softmax", seed=13)


def test_no_state_no_final():
    run_case(2, 9, 2, 2, "identity", h0=False, final=False, seed=6)


def test_materialized_block_scan():
    g = torch.Generator().manual_seed(7)
    A = (torch.randn(2, 11, 2, 3, 3, generator=g) / 3).requires_grad_()
    b = torch.randn(2, 11, 2, 3, generator=g).requires_grad_()
    h, hf = materialized_block_scan(A, b, output_final_state=True)
    Ar, br = A.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    hr, hfr = block_scan_ref(Ar, br, output_final_state=True)
    gh = torch.randn(h.shape, generator=g)
    da, db = torch.autograd.grad((h * gh).sum(), [A, b])
    ra, rb = torch.autograd.grad((hr * gh.double()).sum(), [Ar, br])
    assert max(rel(h, hr), rel(hf, hfr), rel(da, ra), rel(db, rb)) < 2e-5


def test_stability_property():
    # Proposition 1: ‖h_T‖∞ ≤ max ‖v_t‖∞ for every normalised variant (any length)
    g = torch.Generator().manual_seed(8)
    z = torch.randn(1, 50, 2, 3, 4, generator=g) * 4
    v = torch.randn(1, 50, 2, 3, generator=g)
    for variant in ["softmax", "tanh"]:
        h, _ = fused_gate_scan(z, v, variant)
        assert h.abs().max() <= v.abs().max() * (1 + 1e-6)


def test_reference_matches_normalize_gates_loop():
    g = torch.Generator().manual_seed(9)
    z = torch.randn(1, 6, 1, 2, 3, generator=g, dtype=torch.float64)
    v = torch.randn(1, 6, 1, 2, generator=g, dtype=torch.float64)
    A, a0 = normalize_gates(z, "softmax")
    h = torch.zeros(2, dtype=torch.float64)
    for t in range(6):
        h = A[0, t, 0] @ h + a0[0, t, 0] * v[0, t, 0]
    hr, _ = fused_gate_scan_ref(z, v)
    assert rel(hr[0, -1, 0], h) < 1e-14


@pytest.mark.parametrize("bad, exc, word", [
    (dict(logits=torch.zeros(1, 4, 2, 3, 3)), ValueError, "logits"),
    (dict(logits=torch.zeros(1, 4, 2, 3, 4, dtype=torch.int64)), TypeError, "logits"),
    (dict(v=[1.0]), TypeError, "v"),
    (dict(variant="cubic"), ValueError, "variant"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(initial_state=torch.zeros(2, 2, 3)), ValueError, "initial_state"),
    (dict(cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.float32)), TypeError, "cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0, 5, 4])), ValueError, "cu_seqlens"),
])
def test_bad_arguments(bad, exc, word):
    args = dict(logits=torch.zeros(1, 4, 2, 3, 4), v=torch.zeros(1, 4, 2, 3))
    args.update(bad)
    with pytest.raises(exc, match=word):
        fused_gate_scan(**args)


def test_compiled_op_time_chunked_matches_eager(monkeypatch, chunked_calls, compiled_chunks_match_eager):
    """With time chunks (forced by ``TUNE["chunk"]``) the ``lrnn_scan.compile`` custom op runs
    the chunked passes as the eager call does: equal outputs, final states and gradients,
    called directly and inside ``torch.compile(fullgraph=True)``; opcheck of the op while it
    chunks (the fake shape of its chunk products ``PT``)."""
    import lrnn_scan.compile as lc
    monkeypatch.setitem(_kmod.TUNE, "chunk", 3)
    calls = chunked_calls(_kmod)
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(1, 7, 2, 2, 3, generator=g).to(DEV), torch.randn(1, 7, 2, 2, generator=g).to(DEV),
          torch.randn(1, 2, 2, generator=g).to(DEV)]
    compiled_chunks_match_eager(lambda z, v, s: fused_gate_scan(z, v, "softmax", 1e-6, s, True),
                                lambda z, v, s: lc.fused_gate_scan(z, v, "softmax", 1e-6, s, True),
                                xs, calls)
    req = [t.detach().clone().requires_grad_(True) for t in xs]
    torch.library.opcheck(lc.register()["fused_gate_fwd"], (*req, None, 1, 0, 1e-6, torch.float32),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
