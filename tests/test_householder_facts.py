"""Facts about generalized Householder products (math.md §8) and exact state-tracking scans."""
import math

import pytest
import torch

import lrnn_scan as ls

D = torch.float64


def unit(*s, seed=0):
    return torch.nn.functional.normalize(torch.randn(*s, generator=torch.Generator().manual_seed(seed),
                                                     dtype=D), dim=-1)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0, 1.7, 2.0])
def test_single_factor_eigenvalues(beta):
    d = 6
    k = unit(1, 1, d)
    A = ls.HouseholderProduct(k, torch.full((1, 1), beta, dtype=D)).to_dense()[0]
    ev = torch.linalg.eigvalsh(A)                      # symmetric: real spectrum
    expected = torch.tensor(sorted([1.0] * (d - 1) + [1 - beta]), dtype=D)
    assert torch.allclose(ev, expected, atol=1e-12)


def test_products_have_spectral_norm_at_most_one():
    k = unit(200, 4, 7, seed=1)
    beta = 2 * torch.rand(200, 4, generator=torch.Generator().manual_seed(2), dtype=D)
    A = ls.HouseholderProduct(k, beta).to_dense()
    assert torch.linalg.matrix_norm(A, ord=2).max() <= 1 + 1e-12


def test_swap_is_a_reflection_with_beta_two():
    d, a, b = 5, 1, 3
    k = torch.zeros(1, 1, d, dtype=D)
    k[0, 0, a], k[0, 0, b] = 1 / math.sqrt(2), -1 / math.sqrt(2)
    A = ls.HouseholderProduct(k, torch.full((1, 1), 2.0, dtype=D)).to_dense()[0]
    P = torch.eye(d, dtype=D)[[0, 3, 2, 1, 4]]
    assert torch.allclose(A, P, atol=1e-15)


@pytest.mark.parametrize("angle", [0.2, 0.9, 2.5])
def test_two_reflections_compose_a_rotation_by_twice_the_angle(angle):
    n1 = torch.tensor([1.0, 0.0], dtype=D)
    n2 = torch.tensor([math.cos(angle), math.sin(angle)], dtype=D)
    op = ls.HouseholderProduct(torch.stack([n1, n2]).view(1, 2, 2), torch.full((1, 2), 2.0, dtype=D))
    R = op.to_dense()[0]
    c, s = math.cos(2 * angle), math.sin(2 * angle)
    assert torch.allclose(R, torch.tensor([[c, -s], [s, c]], dtype=D), atol=1e-14)


def test_pair_spectrum_real_unless_both_betas_exceed_one():
    g = torch.Generator().manual_seed(4)
    k = torch.nn.functional.normalize(torch.randn(2000, 2, 3, generator=g, dtype=D), dim=-1)
    u = torch.rand(2000, 2, generator=g, dtype=D)
    one_small = torch.stack([u[:, 0], 1 + u[:, 1]], -1)           # β1 ≤ 1
    ev = torch.linalg.eigvals(ls.HouseholderProduct(k, one_small).to_dense())
    assert ev.imag.abs().max() < 1e-9
    both_big = 1.5 + 0.5 * u                                       # β ∈ (1.5, 2]
    ev = torch.linalg.eigvals(ls.HouseholderProduct(k, both_big).to_dense())
    assert ev.imag.abs().max() > 1e-3                              # complex pairs occur


def test_modular_addition_with_reflections_theorem6_end_to_end():
    """Negative-eigenvalue paper, Theorem 6: two LRNN layers with reflections only compute
    x_1 + … + x_t mod m at every t. Layer 1 (scalar −1) counts mod 2; layer 2 is a scan over
    2x2 reflections H(θ(x_t, parity_t)) from h_0 = (1, 0), decoded by nearest c_i / d_i."""
    m, T = 5, 1000
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, m, (1, T), generator=g)
    par = ls.scan(ls.Diagonal(-torch.ones(1, T, 1, dtype=D)), torch.ones(1, T, 1, dtype=D))
    par = par[..., 0].round().long()                                # 1, 0, 1, 0, ...
    assert par[0, :4].tolist() == [1, 0, 1, 0]
    theta = torch.where(par == 1, (1 - 2 * x) * math.pi / m, (1 + 2 * x) * math.pi / m).to(D)
    key = torch.stack([-torch.sin(theta / 2), torch.cos(theta / 2)], -1)   # H(θ) = I − 2 k k^T
    op = ls.HouseholderProduct(key.view(1, T, 1, 1, 2), torch.full((1, T, 1, 1), 2.0, dtype=D))
    h0 = torch.tensor([[[1.0, 0.0]]], dtype=D)
    h = ls.scan(op, torch.zeros(1, T, 1, 2, dtype=D), initial_state=h0)[0, :, 0]   # (T, 2)
    R = lambda a: torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=D)
    Hm = lambda a: torch.tensor([[math.cos(a), math.sin(a)], [math.sin(a), -math.cos(a)]], dtype=D)
    d0 = h0[0, 0]
    c0 = Hm(math.pi / m) @ d0
    ds = torch.stack([R(2 * i * math.pi / m) @ d0 for i in range(m)])
    cs = torch.stack([R(-2 * i * math.pi / m) @ c0 for i in range(m)])
    scores = torch.maximum(h @ ds.T, h @ cs.T)                      # (T, m)
    decoded = scores.argmax(-1)
    truth = torch.cumsum(x[0], 0) % m
    assert torch.equal(decoded, truth)


def test_counting_mod_m_with_a_rotation():
    m, T = 7, 500
    a = 2 * math.pi / m
    n1 = torch.tensor([1.0, 0.0], dtype=D)
    n2 = torch.tensor([math.cos(a / 2), math.sin(a / 2)], dtype=D)
    keys = torch.stack([n1, n2]).expand(1, T, 1, 2, 2).contiguous()
    op = ls.HouseholderProduct(keys, torch.full((1, T, 1, 2), 2.0, dtype=D))
    h = ls.scan(op, torch.zeros(1, T, 1, 2, dtype=D),
                initial_state=torch.tensor([[[1.0, 0.0]]], dtype=D))[0, :, 0]
    count = (torch.atan2(h[:, 1], h[:, 0]) / a).round().long() % m
    assert torch.equal(count, torch.arange(1, T + 1) % m)
