"""GPU checks of the fused-gate block-diagonal and companion kernels against fp64 references.

Run with ``pytest tests/gpu``; skipped without CUDA. Every output is NaN-poisoned before the
kernels write it (``LRNN_SCAN_POISON=1``). References run in float64 on the CPU.
"""
import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("LRNN_SCAN_POISON", "1")
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
try:
    from lrnn_scan.kernels.companion import (companion_scan, companion_scan_coeffs,
                                             companion_scan_coeffs_ref, companion_scan_ref)
    from lrnn_scan.kernels.fused_gates import fused_gate_scan, fused_gate_scan_ref
except ImportError:  # source tree without an install
    from kernels.companion import (companion_scan, companion_scan_coeffs, companion_scan_coeffs_ref,
                                   companion_scan_ref)
    from kernels.fused_gates import fused_gate_scan, fused_gate_scan_ref

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
VARIANTS = ["softmax", "sigmoid", "relu", "tanh", "identity", "none"]
DEV = "cuda"


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert torch.isfinite(a).all(), "non-finite values (unwritten output?)"
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _check(fn, ref, tensors, tol, final=True, ref_dev="cpu", **kw):
    """Run kernel and fp64 reference (on ref_dev); compare h, h_final and all grads."""
    xs = [t.to(DEV).requires_grad_() for t in tensors]
    h, hf = fn(*xs, output_final_state=final, **kw)
    gh = torch.randn_like(h)
    loss = (h * gh).sum()
    if final:
        ghf = torch.randn_like(hf)
        loss = loss + (hf * ghf).sum()
    grads = torch.autograd.grad(loss, xs)
    cpu = [t.detach().to(ref_dev).double().requires_grad_() for t in tensors]
    kw_cpu = {k: (v.to(ref_dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    hr, hfr = ref(*cpu, output_final_state=final, **kw_cpu)
    lr = (hr.double() * gh.to(ref_dev).double()).sum()
    if final:
        lr = lr + (hfr.double() * ghf.to(ref_dev).double()).sum()
    rgrads = torch.autograd.grad(lr, cpu)
    errs = [rel(h, hr)] + ([rel(hf, hfr)] if final else []) + [rel(a, b) for a, b in zip(grads, rgrads)]
    print(f"\n[errors] max {max(errs):.2e} (tol {tol:.0e}): " + " ".join(f"{e:.2e}" for e in errs))
    assert max(errs) < tol, errs
    return errs


def _fused(B, T, H, m, variant="softmax", dtype=torch.float32, h0=True, cu=None, tol=1e-5,
           ref_dev="cpu"):
    z = torch.randn(B, T, H, m, m + 1, dtype=dtype) * (0.3 if variant == "none" else 1.5)
    v = torch.randn(B, T, H, m, dtype=dtype)
    ns = B if cu is None else len(cu) - 1
    tensors = [z, v] + ([torch.randn(ns, H, m)] if h0 else [])
    cuk = None if cu is None else torch.tensor(cu, dtype=torch.int64)

    def fn(z, v, *s, **kw):
        return fused_gate_scan(z, v, variant, initial_state=s[0] if s else None,
                               cu_seqlens=None if cuk is None else cuk.to(DEV), **kw)

    def ref(z, v, *s, **kw):
        return fused_gate_scan_ref(z, v, variant, initial_state=s[0] if s else None,
                                   cu_seqlens=cuk, **kw)
    return _check(fn, ref, tensors, tol, ref_dev=ref_dev)


def _comp(B, T, N, m, variant="softmax", dtype=torch.float32, h0=True, cu=None, tol=1e-5,
          ref_dev="cpu"):
    coeffs = variant == "coeffs"
    z = (torch.rand(B, T, N, m, dtype=dtype) / m if coeffs
         else torch.randn(B, T, N, m + 1, dtype=dtype) * (0.3 if variant == "none" else 1.5))
    v = torch.randn(B, T, N, dtype=dtype)
    ns = B if cu is None else len(cu) - 1
    tensors = [z, v] + ([torch.randn(ns, N, m)] if h0 else [])
    cuk = None if cu is None else torch.tensor(cu, dtype=torch.int64)

    def fn(z, v, *s, **kw):
        cu_d = None if cuk is None else cuk.to(DEV)
        if coeffs:
            return companion_scan_coeffs(z, v, initial_state=s[0] if s else None, cu_seqlens=cu_d, **kw)
        return companion_scan(z, v, variant, initial_state=s[0] if s else None, cu_seqlens=cu_d, **kw)

    def ref(z, v, *s, **kw):
        if coeffs:
            return companion_scan_coeffs_ref(z, v, initial_state=s[0] if s else None, cu_seqlens=cuk, **kw)
        return companion_scan_ref(z, v, variant, initial_state=s[0] if s else None, cu_seqlens=cuk, **kw)
    return _check(fn, ref, tensors, tol, ref_dev=ref_dev)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_variants(variant):
    torch.manual_seed(0)
    _fused(2, 300, 5, 4, variant)


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 32])
def test_fused_block_sizes(m):
    torch.manual_seed(m)
    _fused(2, 129, 3, m)


def test_fused_bf16():
    torch.manual_seed(1)
    _fused(2, 256, 8, 8, dtype=torch.bfloat16, tol=5e-3)


def test_fused_varlen():
    torch.manual_seed(2)
    _fused(1, 200, 4, 4, "sigmoid", cu=[0, 1, 63, 64, 150, 150, 200])


def test_fused_long():
    torch.manual_seed(3)
    _fused(1, 65536, 2, 4, h0=False, ref_dev=DEV)  # fp64 loop on the GPU: faster than the CPU


def _chunk_calls(monkeypatch, record, family="fused_gates", chunk=None):
    """The names of ``family``'s time-chunked passes as they run (``chunked_calls`` fixture);
    ``chunk``: force that many steps a chunk."""
    mod = importlib.import_module(f"lrnn_scan.kernels.{family}.function")
    if chunk is not None:
        monkeypatch.setitem(mod.TUNE, "chunk", chunk)
    return record(mod)


@pytest.mark.parametrize("m", [2, 3, 4, 8, 16, 32])
def test_fused_time_chunked(m, monkeypatch, chunked_calls):
    calls = _chunk_calls(monkeypatch, chunked_calls, chunk=100)
    torch.manual_seed(20 + m)
    _fused(2, 1001, 3, m)
    assert calls == ["chunked_forward", "chunked_backward"]


def test_fused_time_chunked_bf16_varlen(monkeypatch, chunked_calls):
    calls = _chunk_calls(monkeypatch, chunked_calls, chunk=64)
    torch.manual_seed(27)
    _fused(1, 1000, 8, 4, "sigmoid", dtype=torch.bfloat16, cu=[0, 1, 63, 64, 150, 150, 1000], tol=5e-3)
    assert calls == ["chunked_forward", "chunked_backward"]


@pytest.mark.parametrize("m,T", [(4, 65537), (8, 8193), (2, 4097)])
def test_fused_time_chunked_by_rule_long(m, T, monkeypatch, chunked_calls):
    """One long sequence: the default rule (``function.choose_chunk``) chunks it."""
    calls = _chunk_calls(monkeypatch, chunked_calls)
    torch.manual_seed(28)
    _fused(1, T, 4, m, h0=True, ref_dev=DEV)
    assert calls == ["chunked_forward", "chunked_backward"]


@pytest.mark.parametrize("m", [2, 4, 8])
def test_auto_fused_chunked_with_gradients(m, monkeypatch, chunked_calls):
    """``bdlru_scan(method="auto")`` with gradients at B1 T8193 N768 takes the chunked fused
    passes (not the unfused path), every gradient against fp64."""
    import lrnn_scan as ls
    calls = _chunk_calls(monkeypatch, chunked_calls)
    H = 768 // m
    torch.manual_seed(29)
    tensors = [torch.randn(1, 8193, H, m, m + 1) * 1.5, torch.randn(1, 8193, H, m), torch.randn(1, H, m)]

    def fn(z, v, s, **kw):
        return ls.bdlru_scan(z, v, "softmax", initial_state=s, **kw)

    def ref(z, v, s, **kw):
        return fused_gate_scan_ref(z, v, "softmax", initial_state=s, **kw)
    _check(fn, ref, tensors, 1e-5, ref_dev=DEV)
    assert calls == ["chunked_forward", "chunked_backward"]


@pytest.mark.parametrize("m", [2, 3, 4, 8, 16, 32])
@pytest.mark.parametrize("variant", ["softmax", "coeffs"])
def test_companion_time_chunked(m, variant, monkeypatch, chunked_calls):
    """The companion's time-chunked passes (``companion/chunked.py``), forced 100-step chunks."""
    calls = _chunk_calls(monkeypatch, chunked_calls, "companion", 100)
    torch.manual_seed(40 + m)
    _comp(2, 1001, 24, m, variant)
    assert calls == ["chunked_forward", "chunked_backward"]


def test_companion_time_chunked_bf16_varlen(monkeypatch, chunked_calls):
    calls = _chunk_calls(monkeypatch, chunked_calls, "companion", 64)
    torch.manual_seed(47)
    _comp(1, 1000, 32, 4, "sigmoid", dtype=torch.bfloat16, cu=[0, 1, 63, 64, 150, 150, 1000], tol=5e-3)
    assert calls == ["chunked_forward", "chunked_backward"]


def test_companion_time_chunked_long(monkeypatch, chunked_calls):
    calls = _chunk_calls(monkeypatch, chunked_calls, "companion", 256)
    torch.manual_seed(48)
    _comp(1, 65537, 8, 4, h0=True, ref_dev=DEV)
    assert calls == ["chunked_forward", "chunked_backward"]


@pytest.mark.parametrize("variant", VARIANTS + ["coeffs"])
def test_companion_variants(variant):
    torch.manual_seed(0)
    _comp(2, 300, 37, 4, variant)


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 32, 64])  # 32, 64: 8-channel, 12-stage forward
def test_companion_orders(m):
    torch.manual_seed(m)
    _comp(2, 129, 40, m)


def test_companion_bf16():
    torch.manual_seed(1)
    _comp(2, 256, 64, 8, dtype=torch.bfloat16, tol=5e-3)


def test_companion_varlen():
    torch.manual_seed(2)
    _comp(1, 200, 33, 3, "tanh", cu=[0, 1, 2, 63, 64, 150, 150, 200])


def test_companion_long(monkeypatch):
    """One pass (no time chunks: ``TUNE["chunk"] = 0``) over 65536 steps."""
    monkeypatch.setitem(importlib.import_module("lrnn_scan.kernels.companion.function").TUNE, "chunk", 0)
    torch.manual_seed(3)
    _comp(1, 65536, 3, 4, h0=False, ref_dev=DEV)


@pytest.mark.parametrize("m,variant,B,T", [(2, "coeffs", 1, 8193), (4, "softmax", 2, 4097),
                                           (8, "coeffs", 1, 4097), (8, "sigmoid", 2, 4096)])
def test_companion_time_chunked_by_rule(m, variant, B, T, monkeypatch, chunked_calls):
    """A few long sequences at N768: the default rule (``companion.function.choose_chunk``)
    chunks them (128 / 256 steps), every gradient against fp64."""
    cf = importlib.import_module("lrnn_scan.kernels.companion.function")
    if cf.choose_chunk(None, B, T, 768, m, torch.device(DEV), variant != "coeffs") is None:
        pytest.skip("this GPU has too few SMs for the shape to fall below the line")
    calls = _chunk_calls(monkeypatch, chunked_calls, "companion")
    torch.manual_seed(49 + m)
    _comp(B, T, 768, m, variant, ref_dev=DEV)
    assert calls == ["chunked_forward", "chunked_backward"]


@pytest.mark.parametrize("kind,m,N", [("fused", 2, 768), ("fused", 4, 768), ("fused", 8, 768),
                                      ("coeffs", 2, 768), ("coeffs", 4, 768), ("coeffs", 8, 768),
                                      ("coeffs", 16, 768), ("softmax", 4, 768), ("coeffs", 4, 4096)])
def test_benchmark_shape_configs(kind, m, N):
    """The launch configurations of the benchmark's shape (B8, N768: 12-stage companion forwards,
    32- / 128-element companion backward tiles, 8 blocks a program for the fused m = 2; N4096:
    the doubled backward tile), at an odd length, with h0 and the final state, against fp64 (on
    the GPU) with all gradients."""
    torch.manual_seed(10 + m)
    if kind == "fused":
        _fused(8, 1001, N // m, m, ref_dev=DEV)
    else:
        _comp(8, 1001, N, m, kind, ref_dev=DEV)


def _big_check(fn, ref, z, v, nb):
    """Kernel on a tensor with > 2^31 elements; check the last ``nb`` batch rows (largest offsets)."""
    z.requires_grad_()
    v.requires_grad_()
    h, _ = fn(z, v)
    gh = torch.randn_like(h[-nb:])
    dz, dv = torch.autograd.grad((h[-nb:] * gh).sum(), [z, v])
    zs = z[-nb:].detach().cpu().double().requires_grad_()
    vs = v[-nb:].detach().cpu().double().requires_grad_()
    hr, _ = ref(zs, vs)
    rz, rv = torch.autograd.grad((hr * gh.cpu().double()).sum(), [zs, vs])
    errs = [rel(h[-nb:], hr), rel(dz[-nb:], rz), rel(dv[-nb:], rv)]
    print("\n[errors, > 2^31 elements, bf16] " + " ".join(f"{e:.2e}" for e in errs))
    assert max(errs) < 2e-2, errs
    return errs


def _free_gib():
    free, _ = torch.cuda.mem_get_info()
    return free / 2**30


def test_fused_int64_offsets():
    B, T, H, m = 4096, 256, 32, 8          # logits: 2.4e9 elements (> 2^31)
    if _free_gib() < 24:
        pytest.skip("needs ~24 GiB of free GPU memory")
    torch.manual_seed(4)
    z = torch.randn(B, T, H, m, m + 1, device=DEV, dtype=torch.bfloat16)
    assert z.numel() > 2**31
    v = torch.randn(B, T, H, m, device=DEV, dtype=torch.bfloat16)
    _big_check(lambda z, v: fused_gate_scan(z, v), lambda z, v: fused_gate_scan_ref(z, v), z, v, 2)


def test_companion_int64_offsets():
    B, T, N, m = 4096, 256, 512, 4         # logits: 2.7e9 elements (> 2^31)
    if _free_gib() < 24:
        pytest.skip("needs ~24 GiB of free GPU memory")
    torch.manual_seed(5)
    z = torch.randn(B, T, N, m + 1, device=DEV, dtype=torch.bfloat16)
    assert z.numel() > 2**31
    v = torch.randn(B, T, N, device=DEV, dtype=torch.bfloat16)
    _big_check(lambda z, v: companion_scan(z, v), lambda z, v: companion_scan_ref(z, v), z, v, 2)


@pytest.mark.parametrize("family", ["bdlru", "hlru"])
def test_unfused_method(family, monkeypatch):
    """``bdlru_scan`` / ``hlru_scan`` with ``method="unfused"`` on CUDA: torch normalisation, then
    the block-diagonal / companion-coefficient scan kernels (the fused modules are never asked
    for), against the fp64 references with every gradient, varlen with an initial state."""
    import lrnn_scan as ls
    from lrnn_scan import gated
    monkeypatch.setattr(gated, "kernel_module", lambda name: pytest.fail(f"fused {name} asked for"))
    torch.manual_seed(5)
    cu = torch.tensor([0, 1, 63, 64, 150, 150, 300], dtype=torch.int64)
    shape = (1, 300, 4, 3, 4) if family == "bdlru" else (1, 300, 6, 4)
    z, v = torch.randn(shape) * 1.5, torch.randn(shape[:-1] if family == "bdlru" else shape[:3])
    state = (6, 4, 3) if family == "bdlru" else (6, 6, 3)  # (sequences, H or N, m)
    tensors = [z, v, torch.randn(state)]
    scan_fn, ref_fn = ((ls.bdlru_scan, fused_gate_scan_ref) if family == "bdlru"
                       else (ls.hlru_scan, companion_scan_ref))

    def fn(z, v, s, **kw):
        return scan_fn(z, v, "softmax", initial_state=s, cu_seqlens=cu.to(DEV), method="unfused", **kw)

    def ref(z, v, s, **kw):
        return ref_fn(z, v, "softmax", initial_state=s, cu_seqlens=cu, **kw)
    _check(fn, ref, tensors, 1e-5)


@pytest.mark.parametrize("m,T", [(16, 2049), (32, 513)])
def test_auto_unfused_for_few_long_sequences(monkeypatch, m, T):
    """``bdlru_scan(method="auto")`` at B1 N768 past the step line of ``fused_gates.unfused_faster``
    (below its programs line on an H100 / H200) takes the unfused path (the fused kernel is not
    called) and matches the fp64 reference with every gradient."""
    import lrnn_scan as ls
    import lrnn_scan.kernels.fused_gates as fg
    H = 768 // m
    if not fg.unfused_faster(1, T, H, m, torch.device(DEV)):
        pytest.skip("this GPU has too few SMs for the shape to fall below the line")
    monkeypatch.setattr(fg, "fused_gate_scan", lambda *a, **k: pytest.fail("fused kernel called"))
    torch.manual_seed(6)
    tensors = [torch.randn(1, T, H, m, m + 1) * 1.5, torch.randn(1, T, H, m), torch.randn(1, H, m)]

    def fn(z, v, s, **kw):
        return ls.bdlru_scan(z, v, "softmax", initial_state=s, **kw)

    def ref(z, v, s, **kw):
        return fused_gate_scan_ref(z, v, "softmax", initial_state=s, **kw)
    _check(fn, ref, tensors, 1e-5, ref_dev=DEV)


@pytest.mark.parametrize("m,T", [(16, 513), (4, 4097)])
def test_auto_unfused_forward_alone(monkeypatch, m, T):
    """Without a backward (``torch.no_grad``) ``bdlru_scan(method="auto")`` takes the unfused path
    from the shorter forward step line (``UNFUSED_LINES[MP][1]``); under grad mode the same shape
    stays fused. Outputs and final state against the fp64 reference."""
    import lrnn_scan as ls
    import lrnn_scan.kernels.fused_gates as fg
    H = 768 // m
    if not fg.unfused_faster(1, T, H, m, torch.device(DEV), backward=False):
        pytest.skip("this GPU has too few SMs for the shape to fall below the line")
    assert not fg.unfused_faster(1, T, H, m, torch.device(DEV))
    torch.manual_seed(7)
    z, v, s = torch.randn(1, T, H, m, m + 1) * 1.5, torch.randn(1, T, H, m), torch.randn(1, H, m)
    hr, hfr = fused_gate_scan_ref(z.double(), v.double(), "softmax", initial_state=s.double(),
                                  output_final_state=True)
    zc, vc, sc = z.to(DEV), v.to(DEV), s.to(DEV)
    with monkeypatch.context() as mp:
        mp.setattr(fg, "fused_gate_scan", lambda *a, **k: pytest.fail("fused kernel called"))
        with torch.no_grad():
            h, hf = ls.bdlru_scan(zc, vc, "softmax", initial_state=sc, output_final_state=True)
    errs = [rel(h, hr.to(DEV)), rel(hf, hfr.to(DEV))]
    print(f"\n[errors] max {max(errs):.2e} (tol 1e-05): " + " ".join(f"{e:.2e}" for e in errs))
    assert max(errs) < 1e-5, errs
    calls = []
    kernel = fg.fused_gate_scan
    monkeypatch.setattr(fg, "fused_gate_scan", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    ls.bdlru_scan(zc.requires_grad_(), vc, "softmax", initial_state=sc)
    assert calls == [1]
