"""Property tests of the operator algebra (hypothesis + lrnn_scan.testing.check_operator_laws)."""
import pytest
import torch
from hypothesis import given

import lrnn_scan as ls
from lrnn_scan.testing import (FAMILIES, check_operator_laws, operator_triples, operators,
                               random_operator, rel_err)

RTOL = 1e-10


@given(operator_triples(max_d=8, mixed=False))
def test_combine_is_associative_within_a_family(ops):
    _check_associative(ops)


@given(operator_triples(max_d=8, mixed=True))
def test_combine_is_associative_for_mixed_compositions(ops):
    _check_associative(ops)


def _check_associative(ops):
    a, b, c = ops
    g = torch.Generator().manual_seed(0)
    shape = (*a.batch_shape, a.state_size)
    xa, xb, xc = (torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3))
    combine = lambda e1, e2: (ls.compose(e2[0], e1[0]), e2[0].apply(e1[1]) + e2[1])
    left = combine(combine((a, xa), (b, xb)), (c, xc))
    right = combine((a, xa), combine((b, xb), (c, xc)))
    assert rel_err(left[0].to_dense(), right[0].to_dense()) < RTOL
    assert rel_err(left[1], right[1]) < RTOL


@given(operators(max_d=8))
def test_transpose_laws(op):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*op.batch_shape, op.state_size, generator=g, dtype=torch.float64)
    y = torch.randn_like(x)
    assert rel_err(op.transpose().to_dense(), op.to_dense().mT) < RTOL
    lhs, rhs = (op.apply(x) * y).sum(), (x * op.transpose().apply(y)).sum()
    assert abs(lhs - rhs).item() <= RTOL * max(1.0, abs(lhs).item())
    assert rel_err(op.identity_like().apply(x), x) < RTOL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("d", [1, 2, 5])
def test_builtin_operators_satisfy_all_laws(family, d):
    for n_h in ([1, 3] if family == "householder" else [1]):
        check_operator_laws(lambda bs, g, dt: random_operator(family, bs, d, g, dt, n_h=n_h),
                            batch_shape=(2, 9, 3))


def test_householder_compose_stays_in_family_then_promotes():
    g = torch.Generator().manual_seed(0)
    a = random_operator("householder", (2, 3), 6, g, n_h=2)
    b = random_operator("householder", (2, 3), 6, g, n_h=3)
    ab = ls.compose(a, b)
    assert isinstance(ab, ls.HouseholderProduct) and ab.n_h == 5
    abb = ls.compose(ab, b)                      # 8 factors > d = 6: dense is cheaper
    assert isinstance(abb, ls.BlockDiagonal)
    assert rel_err(abb.to_dense(), a.to_dense() @ b.to_dense() @ b.to_dense()) < RTOL


def test_companion_compositions_promote_to_dense_blocks():
    g = torch.Generator().manual_seed(0)
    a = random_operator("companion", (2, 4, 3), 4, g)
    b = random_operator("companion", (2, 4, 3), 4, g)
    ab = ls.compose(a, b)
    assert isinstance(ab, ls.BlockDiagonal)
    assert rel_err(ab.to_dense(), a.to_dense() @ b.to_dense()) < RTOL


def test_diagonal_times_householder_is_a_well_defined_mixed_step():
    """A per-key decay (GLA-style) composed with a delta-rule step, scanned over time."""
    g = torch.Generator().manual_seed(3)
    decay = ls.Diagonal(torch.rand(2, 17, 3, 5, generator=g, dtype=torch.float64))
    hh = random_operator("householder", (2, 17, 3), 5, g, n_h=2)
    step = ls.compose(hh, decay)                 # decay first, then the Householder factors
    b = torch.randn(2, 17, 3, 5, 4, generator=g, dtype=torch.float64)
    h = ls.scan(step, b)
    state = torch.zeros(2, 3, 5, 4, dtype=torch.float64)
    for t in range(17):
        state = hh.select_time(1, t).apply(decay.select_time(1, t).apply(state.unsqueeze(1))) \
            .squeeze(1) + b[:, t]
        assert rel_err(h[:, t], state) < RTOL
