"""The L1-normalised gates and Proposition 1 (‖h‖_∞ ≤ max ‖v‖_∞ for every length)."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lrnn_scan as ls
from lrnn_scan.gates import GATE_VARIANTS, gate_function, normalize_gates
from lrnn_scan.testing import rel_err

NORMALISED = [v for v in GATE_VARIANTS if v != "none"]
D = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("variant", GATE_VARIANTS)
def test_matches_the_definition(variant):
    z = torch.randn(3, 5, 4, 6, generator=gen(0), dtype=D)          # (..., rows, m+1), m = 5
    A, a0 = normalize_gates(z, variant)
    assert A.shape == (3, 5, 4, 5) and a0.shape == (3, 5, 4)
    f = gate_function(variant, z)
    if variant == "none":
        ref = z
    elif variant in ("softmax", "sigmoid"):
        ref = f / f.abs().sum(-1, keepdim=True)
    else:
        ref = f / (f.abs().sum(-1, keepdim=True) + 1e-6)
    assert rel_err(torch.cat([a0.unsqueeze(-1), A], -1), ref) < 1e-12


@pytest.mark.parametrize("variant", NORMALISED)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, D])
def test_rows_have_l1_norm_at_most_one_and_are_finite_for_huge_logits(variant, dtype):
    signs = torch.randint(0, 2, (64, 3, 9), generator=gen(1)) * 2 - 1
    z = (signs * 1e4 * torch.rand(64, 3, 9, generator=gen(2))).to(dtype).requires_grad_()
    A, a0 = normalize_gates(z, variant)
    assert torch.isfinite(A).all() and torch.isfinite(a0).all()
    l1 = A.abs().float().sum(-1) + a0.abs().float()
    assert l1.max() <= 1 + (1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6)
    (A.sum() + a0.sum()).backward()
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize("variant", GATE_VARIANTS)
def test_gradcheck(variant):
    z = torch.randn(2, 3, 4, generator=gen(3), dtype=D)
    z = z + 0.2 * torch.sign(z)                   # stay away from the kinks of relu/|tanh|/|z|
    z.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: normalize_gates(t, variant), (z,))


def test_aliases_and_errors():
    z = torch.randn(2, 3, 4)
    assert torch.equal(normalize_gates(z, "exp")[0], normalize_gates(z, "softmax")[0])
    with pytest.raises(ValueError, match="unknown gate variant 'softplus'"):
        normalize_gates(z, "softplus")
    with pytest.raises(ValueError, match="m \\+ 1"):
        normalize_gates(torch.randn(2, 3, 1))
    with pytest.raises(ValueError, match="eps must be > 0"):
        normalize_gates(z, "relu", eps=0.0)
    with pytest.raises(TypeError, match="floating"):
        normalize_gates(torch.ones(2, 3, 4, dtype=torch.long))


def adversarial_logits(shape, seed):
    g = gen(seed)
    signs = torch.randint(0, 2, shape, generator=g) * 2 - 1
    mag = torch.where(torch.rand(shape, generator=g) < 0.5, torch.full(shape, 1e4),
                      3 * torch.rand(shape, generator=g))
    return (signs * mag).to(D)


@pytest.mark.parametrize("variant", NORMALISED)
def test_proposition1_bdlru_long_sequence(variant):
    """T = 1e5 with adversarial logits (±1e4, random signs): max|h| ≤ max|v|."""
    T = 100_000
    for m in (1, 2, 4):
        z = adversarial_logits((1, T, 2, m, m + 1), seed=m)
        v = torch.randn(1, T, 2, m, generator=gen(m), dtype=D) * 3
        h = ls.bdlru_scan(z, v, variant)
        assert h.abs().max() <= v.abs().max() * (1 + 1e-9), (variant, m)


@pytest.mark.parametrize("variant", NORMALISED)
def test_proposition1_hlru_long_sequence(variant):
    T = 100_000
    z = adversarial_logits((1, T, 4, 4), seed=9)                   # order m = 3
    v = torch.randn(1, T, 4, generator=gen(9), dtype=D) * 3
    h = ls.hlru_scan(z, v, variant)
    assert h.abs().max() <= v.abs().max() * (1 + 1e-9)


@given(variant=st.sampled_from(NORMALISED), family=st.sampled_from(["bdlru", "hlru"]),
       m=st.integers(1, 5), T=st.integers(1, 200), log_mag=st.floats(-3, 4), log_v=st.floats(-3, 3),
       h0=st.booleans(), method=st.sampled_from(["sequential", "blelloch"]), seed=st.integers(0, 2 ** 16))
def test_proposition1_property(variant, family, m, T, log_mag, log_v, h0, method, seed):
    """Proposition 1 as a property: rows of ``[A_t, a0_t]`` with L1 norm <= 1 give
    ``|h_t|_inf <= max(|h_0|_inf, max_s |v_s|_inf)`` for every t, and the final state too, for
    any gate variant, block size or order, length, logit magnitude (1e-3 .. 1e4, random signs),
    value scale, initial state and scan method (fp64, relative slack 1e-9)."""
    g = gen(seed)
    shape = (2, T, 3, m, m + 1) if family == "bdlru" else (2, T, 3, m + 1)
    signs = torch.randint(0, 2, shape, generator=g) * 2 - 1
    z = (signs * 10 ** log_mag * torch.rand(shape, generator=g)).to(D)
    v = torch.randn(shape[:-1] if family == "bdlru" else shape[:3], generator=g, dtype=D) * 10 ** log_v
    state = torch.randn(2, 3, m, generator=g, dtype=D) * 10 ** log_v * 2 if h0 else None
    fn = ls.bdlru_scan if family == "bdlru" else ls.hlru_scan
    h, hT = fn(z, v, variant, initial_state=state, output_final_state=True, method=method)
    bound = max(v.abs().max(), state.abs().max() if h0 else 0.0) * (1 + 1e-9)
    assert h.abs().max() <= bound and hT.abs().max() <= bound, (h.abs().max(), hT.abs().max(), bound)


def test_unnormalised_gates_can_blow_up():
    """The bound is a property of the normalisation: without it the same logits diverge."""
    z = torch.full((1, 200, 1, 2, 3), 1.0, dtype=D)
    v = torch.ones(1, 200, 1, 2, dtype=D)
    assert ls.bdlru_scan(z, v, "none").abs().max() > 1e10
    assert ls.bdlru_scan(z, v, "softmax").abs().max() <= 1


@pytest.mark.parametrize("family", ["bdlru", "hlru"])
def test_unfused_method_skips_the_fused_kernel(family, monkeypatch):
    """``method="unfused"`` normalises with torch and calls ``scan(method="auto")`` even where the
    fused kernel would run (CUDA faked here: the fused module must not be asked for); it equals
    the sequential reference. An unknown method names the accepted ones."""
    from lrnn_scan import _kernel_modules, gated
    g = gen(3)
    shape = (2, 33, 3, 2, 3) if family == "bdlru" else (2, 33, 3, 3)
    z = torch.randn(shape, generator=g, dtype=D)
    v = torch.randn(shape[:-1] if family == "bdlru" else shape[:3], generator=g, dtype=D)
    fn = ls.bdlru_scan if family == "bdlru" else ls.hlru_scan
    want = fn(z, v, method="sequential")
    asked = []

    def no_fused_kernels(name):
        asked.append(name)
        raise ImportError("the fused kernels are not wanted here")

    monkeypatch.setattr(_kernel_modules, "kernel_device", lambda device: True)
    monkeypatch.setattr(gated, "kernel_module", no_fused_kernels)
    got = fn(z, v, method="unfused")
    assert asked == [] and torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="unfused"):
        fn(z, v, method="fused")


def test_bdlru_auto_takes_unfused_for_few_long_sequences(monkeypatch):
    """``bdlru_scan(method="auto")`` on (faked) CUDA: the fused kernel unless its module's
    ``unfused_faster`` says otherwise (then normalise with torch and scan, equal to the
    sequential reference); the rule is told whether a backward will run (an input that requires
    grad, grad mode on) and is not asked with ``cu_seqlens`` or 16-bit logits."""
    from lrnn_scan import _kernel_modules, gated
    calls, asked = [], []

    class Fake:
        flag = True

        @staticmethod
        def fused_gate_scan(z, v, **kw):
            calls.append(z.dtype)
            return torch.zeros_like(v), None

        @staticmethod
        def unfused_faster(B, T, H, m, device, backward=True):
            asked.append((B, T, H, m, backward))
            return Fake.flag
    monkeypatch.setattr(_kernel_modules, "kernel_device", lambda device: True)
    monkeypatch.setattr(gated, "kernel_module", lambda name: Fake)
    g = gen(4)
    z = torch.randn(2, 9, 3, 2, 3, generator=g)
    v = torch.randn(2, 9, 3, 2, generator=g)
    got = ls.bdlru_scan(z, v)
    want = ls.bdlru_scan(z.double(), v.double(), method="sequential")
    assert calls == [] and asked == [(2, 9, 3, 2, False)] and rel_err(got, want) < 1e-5
    ls.bdlru_scan(z.requires_grad_(), v)                         # a backward will run
    with torch.no_grad():
        ls.bdlru_scan(z, v)
    h0 = torch.zeros(2, 3, 2, requires_grad=True)
    ls.bdlru_scan(z.detach(), v, initial_state=h0)
    assert [a[-1] for a in asked] == [False, True, False, True]
    z = z.detach()
    asked.clear()
    Fake.flag = False
    assert ls.bdlru_scan(z, v).abs().max() == 0 and calls == [torch.float32]
    asked.clear()
    ls.bdlru_scan(z.bfloat16(), v.bfloat16())
    ls.bdlru_scan(z[:1], v[:1], cu_seqlens=torch.tensor([0, 4, 9]))
    assert asked == [] and calls == [torch.float32, torch.bfloat16, torch.float32]

