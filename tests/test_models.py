"""Layers of ``lrnn_scan.models``: one interface, parallel = recurrent, varlen, Proposition 1.

Everything runs on CPU with tiny sizes (the whole file takes well under a minute on 2 cores).
"""
from __future__ import annotations

import pytest
import torch

import lrnn_scan.models as M
from lrnn_scan.gates import GATE_VARIANTS

D = 6           # d_model used by most tests
NORMALISED = [g for g in GATE_VARIANTS if g != "none"]


def _configs():
    cfg = {}
    for g in GATE_VARIANTS:
        cfg[f"bdlru-{g}"] = lambda g=g: M.BDLRU(D, 6, m=3, gate=g)
        cfg[f"hlru-{g}"] = lambda g=g: M.HLRU(D, 4, m=3, gate=g)
        cfg[f"diag-{g}"] = lambda g=g: M.DiagonalLRU(D, 4, gate=g)
    cfg.update({
        "bdlru-m2-nonselective": lambda: M.BDLRU(D, 4, m=2, gate="sigmoid", selective=False),
        "hlru-nonselective": lambda: M.HLRU(D, 3, m=4, selective=False),
        "diag-nonselective": lambda: M.DiagonalLRU(D, 3, gate="relu", selective=False),
        "deltanet": lambda: M.DeltaNet(D, num_heads=2, head_dim=3, chunk_size=8),
        "deltanet-noconv": lambda: M.DeltaNet(D, num_heads=2, head_dim=3, use_short_conv=False, chunk_size=4),
        "gated-deltanet-neg": lambda: M.GatedDeltaNet(D, 2, head_dim=3, allow_neg_eigval=True, chunk_size=8),
        "deltaproduct-2": lambda: M.DeltaProduct(D, 2, head_dim=3, head_v_dim=2, n_h=2, chunk_size=16),
        "gated-deltaproduct-3-neg-ogate": lambda: M.GatedDeltaProduct(
            D, 2, head_dim=3, n_h=3, allow_neg_eigval=True, use_output_gate=True, chunk_size=8),
        "gated-deltaproduct-scan": lambda: M.GatedDeltaProduct(D, 1, head_dim=4, n_h=2,
                                                               mode="scan", conv_size=3),
        "mamba2": lambda: M.Mamba2(D, d_inner=4, state_size=3),
        "mamba2-heads": lambda: M.Mamba2(D, d_inner=4, state_size=2, num_heads=2),
        "lstm": lambda: M.LSTM(D, 5),
    })
    return cfg


CONFIGS = _configs()
NAMES = sorted(CONFIGS)


def make(name: str, dtype=torch.float64, seed: int = 0):
    torch.manual_seed(seed)
    return CONFIGS[name]().to(dtype)


def random_state(layer, rows, dtype=torch.float64, scale=0.5):
    return {k: scale * torch.randn(v.shape, dtype=dtype)
            for k, v in layer.init_state(rows, dtype=dtype).items()}


def assert_states_close(a, b, **kw):
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k].to(b[k].dtype), b[k], **kw, msg=lambda m: f"state[{k}]: {m}")


TOL = dict(rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------------ shapes / dtypes
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtypes(name, dtype):
    layer = make(name, dtype)
    x = torch.randn(2, 5, D, dtype=dtype)
    y, state = layer(x)
    assert y.shape == x.shape and y.dtype == dtype
    shapes = layer.state_shapes(2)
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: tuple(s) for k, s in shapes.items()}
    y_t, s_t = layer.step(x[:, 0])                      # state=None -> zeros
    assert y_t.shape == (2, D) and y_t.dtype == dtype
    assert {k: tuple(v.shape) for k, v in s_t.items()} == {k: tuple(s) for k, s in shapes.items()}
    assert isinstance(layer.flops_per_step(), int) and layer.flops_per_step() > 0
    spec = layer.transition_spectrum(x)
    assert spec.is_complex() and spec.shape[:2] == (2, 5)


def test_bfloat16_forward():
    for layer in (M.BDLRU(D, 4, m=2), M.HLRU(D, 4, m=2), M.DiagonalLRU(D, 4)):
        layer = layer.to(torch.bfloat16)
        y, state = layer(torch.randn(1, 6, D, dtype=torch.bfloat16))
        assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()


# ------------------------------------------------------------------------------ parallel = recurrent
@pytest.mark.parametrize("name", NAMES)
def test_parallel_equals_recurrent(name):
    layer = make(name)
    B, T = 2, 7
    x = torch.randn(B, T, D, dtype=torch.float64)
    s0 = random_state(layer, B)
    y, s_par = layer(x, s0)
    s, ys = s0, []
    for t in range(T):
        y_t, s = layer.step(x[:, t], s)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y, **TOL)
    assert_states_close(s, s_par, **TOL)
    # state passing: two halves == whole (the short-conv context travels in the state)
    y1, s1 = layer(x[:, :3], s0)
    y2, s2 = layer(x[:, 3:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, **TOL)
    assert_states_close(s2, s_par, **TOL)


# ------------------------------------------------------------------------------ varlen
@pytest.mark.parametrize("name", NAMES)
def test_varlen_equals_separate_sequences(name):
    layer = make(name)
    cu = torch.tensor([0, 3, 3, 8, 10], dtype=torch.int64)      # includes an empty sequence
    n = cu.numel() - 1
    x = torch.randn(1, int(cu[-1]), D, dtype=torch.float64)
    s0 = random_state(layer, n)
    y, s = layer(x, s0, cu_seqlens=cu)
    for i in range(n):
        a, b = int(cu[i]), int(cu[i + 1])
        s_i = {k: v[i:i + 1] for k, v in s0.items()}
        if b > a:
            y_i, s_i = layer(x[:, a:b], s_i)
            torch.testing.assert_close(y[:, a:b], y_i, **TOL)
        assert_states_close({k: v[i:i + 1] for k, v in s.items()}, s_i, **TOL)


def test_varlen_resets_short_conv_context():
    """A token must not see the previous sequence's inputs through the convolution."""
    layer = make("deltanet")
    cu = torch.tensor([0, 4, 8])
    x = torch.randn(1, 8, D, dtype=torch.float64)
    y, _ = layer(x, cu_seqlens=cu)
    x2 = x.clone()
    x2[:, :4] = torch.randn(1, 4, D, dtype=torch.float64)        # change sequence 0 only
    y2, _ = layer(x2, cu_seqlens=cu)
    torch.testing.assert_close(y[:, 4:], y2[:, 4:], rtol=0, atol=0)


# ------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("name", ["bdlru-softmax", "hlru-sigmoid", "gated-deltaproduct-3-neg-ogate",
                                  "mamba2"])
@pytest.mark.parametrize("fast", [True, False])
def test_gradcheck(name, fast):
    """Gradients w.r.t. the input, the initial state and (fast mode) every parameter."""
    layer = make(name)
    x = torch.randn(1, 3, D, dtype=torch.float64, requires_grad=True)
    s0 = random_state(layer, 1)
    h0 = s0["h"].requires_grad_()
    params = dict(layer.named_parameters()) if fast else {}

    def f(x, h0, *ps):
        out = torch.func.functional_call(layer, dict(zip(params, ps)), (x, {**s0, "h": h0}))
        return out[0], out[1]["h"]

    assert torch.autograd.gradcheck(f, (x, h0, *params.values()), atol=1e-6, rtol=1e-4,
                                    fast_mode=fast)


def test_parameter_gradients_flow():
    for name in ("bdlru-softmax", "hlru-nonselective", "gated-deltanet-neg", "mamba2", "lstm"):
        layer = make(name)
        y, _ = layer(torch.randn(2, 5, D, dtype=torch.float64))
        y.square().sum().backward()
        for pname, p in layer.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), (name, pname)


# ------------------------------------------------------------------------------ Proposition 1
def _identity_readout(layer):
    """Make ``y`` equal the scanned states (N == d_model, out_proj = identity)."""
    with torch.no_grad():
        layer.out_proj.weight.copy_(torch.eye(layer.hidden_size, dtype=layer.out_proj.weight.dtype))
        layer.out_proj.bias.zero_()
    return layer


@pytest.mark.parametrize("gate", NORMALISED)
@pytest.mark.parametrize("cls,m", [(M.BDLRU, 1), (M.BDLRU, 3), (M.HLRU, 2), (M.HLRU, 4)])
@pytest.mark.parametrize("selective", [True, False])
def test_proposition_1_inside_layer(gate, cls, m, selective):
    torch.manual_seed(1)
    N = 6
    layer = _identity_readout(cls(N, N, m=m, gate=gate, selective=selective).double())
    with torch.no_grad():                       # adversarial: huge signed logits and values
        for p in layer.parameters():
            if p is not layer.out_proj.weight and p is not layer.out_proj.bias:
                p.copy_(torch.randn_like(p) * 50)
    x = torch.randn(2, 64, N, dtype=torch.float64) * 3
    y, state = layer(x)
    vmax = layer.values(x).abs().max()
    assert y.abs().max() <= vmax * (1 + 1e-12)
    assert state["h"].abs().max() <= vmax * (1 + 1e-12)


def test_none_gate_can_blow_up():
    """Sanity check of the test above: without normalisation the bound does not hold."""
    torch.manual_seed(1)
    layer = _identity_readout(M.BDLRU(4, 4, m=2, gate="none").double())
    with torch.no_grad():
        layer.gate_proj.weight.zero_()
        layer.gate_proj.bias.fill_(1.0)
    x = torch.randn(1, 30, 4, dtype=torch.float64)
    y, _ = layer(x)
    assert y.abs().max() > 10 * layer.values(x).abs().max()


# ------------------------------------------------------------------------------ m = 1 equivalence
@pytest.mark.parametrize("gate", GATE_VARIANTS)
@pytest.mark.parametrize("selective", [True, False])
def test_m1_bdlru_hlru_equal_diagonal(gate, selective):
    torch.manual_seed(2)
    diag = M.DiagonalLRU(D, 5, gate=gate, selective=selective).double()
    bd = M.BDLRU(D, 5, m=1, gate=gate, selective=selective).double()
    hl = M.HLRU(D, 5, m=1, gate=gate, selective=selective).double()
    bd.load_state_dict(diag.state_dict())
    hl.load_state_dict(diag.state_dict())
    x = torch.randn(2, 9, D, dtype=torch.float64)
    h0 = 0.3 * torch.randn(2, 5, dtype=torch.float64)
    y, s = diag(x, {"h": h0})
    for layer in (bd, hl):
        y2, s2 = layer(x, {"h": h0.unsqueeze(-1)})
        torch.testing.assert_close(y2, y, **TOL)
        torch.testing.assert_close(s2["h"].squeeze(-1), s["h"], **TOL)
        torch.testing.assert_close(layer.transition_spectrum(x).squeeze(-1),
                                   diag.transition_spectrum(x), **TOL)


# ------------------------------------------------------------------------------ spectra
def test_spectrum_bounds():
    torch.manual_seed(3)
    x = torch.randn(2, 8, D, dtype=torch.float64)
    for gate in NORMALISED:
        for layer in (M.BDLRU(D, 6, m=3, gate=gate), M.HLRU(D, 4, m=3, gate=gate)):
            lam = layer.double().transition_spectrum(x)
            assert lam.shape[-1] == 3 and lam.abs().max() <= 1 + 1e-9
    # DeltaNet, ungated: eigenvalues {1 (K-1 times), 1 - beta}; with 2*sigmoid they reach below 0
    layer = M.DeltaNet(D, 2, head_dim=3, allow_neg_eigval=True).double()
    lam = layer.transition_spectrum(x)
    assert lam.shape == (2, 8, 2, 3)
    re = lam.real.sort(-1).values
    torch.testing.assert_close(re[..., 1:], torch.ones_like(re[..., 1:]), **TOL)
    assert lam.imag.abs().max() < 1e-9 and re[..., 0].min() >= -1 and re[..., 0].min() < 0
    # DeltaProduct with two reflections can rotate (complex eigenvalues), |λ| ≤ 1 always
    layer = M.GatedDeltaProduct(D, 2, head_dim=3, n_h=2, allow_neg_eigval=True).double()
    with torch.no_grad():
        layer.b_proj.weight.mul_(20)
    lam = layer.transition_spectrum(torch.randn(4, 16, D, dtype=torch.float64))
    assert lam.abs().max() <= 1 + 1e-9 and lam.imag.abs().max() > 1e-3


def test_nonselective_gates_ignore_the_input():
    for layer in (M.BDLRU(D, 4, m=2, selective=False), M.HLRU(D, 3, m=3, selective=False),
                  M.DiagonalLRU(D, 3, selective=False)):
        layer = layer.double()
        assert not any("gate_proj" in n for n, _ in layer.named_parameters())
        lam1 = layer.transition_spectrum(torch.randn(1, 4, D, dtype=torch.float64))
        lam2 = layer.transition_spectrum(torch.randn(1, 4, D, dtype=torch.float64))
        torch.testing.assert_close(lam1, lam2, **TOL)
        torch.testing.assert_close(lam1, lam1[:, :1].expand_as(lam1), **TOL)


def test_mamba2_decays_in_unit_interval():
    lam = make("mamba2-heads").transition_spectrum(torch.randn(2, 6, D, dtype=torch.float64))
    assert lam.shape == (2, 6, 4) and lam.imag.abs().max() == 0
    assert 0 < lam.real.min() and lam.real.max() < 1
    torch.testing.assert_close(lam[..., 0], lam[..., 1])       # 2 heads of 2 channels share a decay


def test_delta_chunk_and_scan_modes_agree():
    pytest.importorskip("lrnn_scan.delta")
    for kw in (dict(n_h=1), dict(n_h=3, gated=True, allow_neg_eigval=True)):
        torch.manual_seed(4)
        a = M.DeltaProduct(D, 2, head_dim=3, mode="chunk", chunk_size=4, **kw).double()
        b = M.DeltaProduct(D, 2, head_dim=3, mode="scan", **kw).double()
        b.load_state_dict(a.state_dict())
        x = torch.randn(1, 11, D, dtype=torch.float64)
        cu = torch.tensor([0, 2, 9, 11])
        s0 = random_state(a, 3)
        ya, sa = a(x, s0, cu_seqlens=cu)
        yb, sb = b(x, s0, cu_seqlens=cu)
        torch.testing.assert_close(ya, yb, **TOL)
        assert_states_close(sa, sb, **TOL)


# ------------------------------------------------------------------------------ FLOPs (Table 5)
def test_flops_per_step_table5():
    assert M.BDLRU(8, 12, m=3).flops_per_step() == 2 * 4 * 9 + 2 * 4       # 2Hm^2 + 2H, H = N/m
    assert M.HLRU(8, 12, m=3).flops_per_step() == 2 * 12 * 3 + 2 * 12      # 2Hm + 2H, H channels
    assert M.DiagonalLRU(8, 12).flops_per_step() == 4 * 12
    assert M.Mamba2(8, d_inner=16, state_size=4).flops_per_step() == 2 * 16 * 4
    assert M.DeltaNet(8, 2, head_dim=4).flops_per_step() == 2 * (4 * 4 + 4 * 4)
    assert M.DeltaProduct(8, 2, head_dim=4, n_h=3).flops_per_step() == 3 * 2 * (4 * 4 + 4 * 4)
    assert M.LSTM(8, 10).flops_per_step() == 8 * 100 + 25 * 10


# ------------------------------------------------------------------------------ bad configuration
@pytest.mark.parametrize("ctor,match", [
    (lambda: M.BDLRU(8, 10, m=3), "multiple of the block size"),
    (lambda: M.BDLRU(8, 6, m=3, gate="softplus"), "unknown gate variant"),
    (lambda: M.HLRU(8, 6, m=0), "m must be >= 1"),
    (lambda: M.DiagonalLRU(8, 0), "hidden_size must be >= 1"),
    (lambda: M.BDLRU(8, 6, m=2, eps=0.0), "eps must be a positive"),
    (lambda: M.DeltaProduct(8, 2, n_h=0), "n_h must be >= 1"),
    (lambda: M.DeltaProduct(10, 4), "not divisible by num_heads"),
    (lambda: M.DeltaProduct(8, 2, mode="fast"), "mode must be one of"),
    (lambda: M.DeltaNet(8, 2, conv_size=0), "kernel_size"),
    (lambda: M.Mamba2(8, d_inner=6, num_heads=4), "must divide d_inner"),
    (lambda: M.LSTM(0), "d_model must be >= 1"),
])
def test_bad_config_raises(ctor, match):
    with pytest.raises(ValueError, match=match):
        ctor()


def test_bad_types_and_inputs_raise():
    with pytest.raises(TypeError, match="m must be an int"):
        M.BDLRU(8, 6, m=2.0)
    with pytest.raises(TypeError, match="n_h = 1"):
        M.DeltaNet(8, 2, n_h=2)
    layer = M.BDLRU(4, 4, m=2)
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, d_model\]"):
        layer(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match=r"x must have shape \[B, d_model\]"):
        layer.step(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="packed batch"):
        layer(torch.randn(2, 3, 4), cu_seqlens=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="end at T=3"):
        layer(torch.randn(1, 3, 4), cu_seqlens=torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"state\['h'\] must have shape \(2, 2, 2\)"):
        layer(torch.randn(2, 3, 4), {"h": torch.zeros(3, 2, 2)})
    with pytest.raises(ValueError, match="keys"):
        layer(torch.randn(2, 3, 4), {"c": torch.zeros(2, 2, 2)})
