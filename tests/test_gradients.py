"""torch.autograd.gradcheck (fp64) of the scan for every operator, through the adjoint scan."""
import pytest
import torch

import lrnn_scan as ls
from lrnn_scan.gates import GATE_VARIANTS
from lrnn_scan.testing import FAMILIES, random_operator

D = torch.float64


def inputs(family, T=6, d=3, seed=0, B=2, H=2, cols=None):
    g = torch.Generator().manual_seed(seed)
    op = random_operator(family, (B, T, H), d, g, n_h=2)
    tail = (d,) if cols is None else (d, cols)
    b = torch.randn(B, T, H, *tail, generator=g, dtype=D)
    h0 = torch.randn(B, H, *tail, generator=g, dtype=D)
    return op, b, h0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["blelloch", "sequential"])
@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_scan(family, method, reverse):
    op, b, h0 = inputs(family, T=7)
    params = [t.clone().requires_grad_() for t in op.tensors()]
    if family == "householder":
        params[0] = params[0].detach().requires_grad_()

    def f(b, h0, *ps):
        o = op.with_tensors(*ps)
        h, hT = ls.scan(o, b, initial_state=h0, output_final_state=True, method=method,
                        reverse=reverse)
        return h, hT

    assert torch.autograd.gradcheck(f, (b.requires_grad_(), h0.requires_grad_(), *params))


def test_gradcheck_householder_matrix_state_through_constructor():
    """Gradients w.r.t. raw keys (normalised inside), β and the gate, matrix state d_k x d_v."""
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(1, 5, 2, 2, 4, generator=g, dtype=D, requires_grad=True)
    beta = (2 * torch.rand(1, 5, 2, 2, generator=g, dtype=D)).requires_grad_()
    gate = torch.rand(1, 5, 2, generator=g, dtype=D, requires_grad=True)
    B = torch.randn(1, 5, 2, 4, 3, generator=g, dtype=D, requires_grad=True)

    def f(keys, beta, gate, B):
        op = ls.HouseholderProduct(keys, beta, gate, normalize_keys=True, check_values=False)
        return ls.scan(op, B)

    assert torch.autograd.gradcheck(f, (keys, beta, gate, B))


def test_gradcheck_companion_newest_only_and_varlen():
    g = torch.Generator().manual_seed(2)
    a = (torch.rand(1, 9, 2, 3, generator=g, dtype=D) / 3).requires_grad_()
    v = torch.randn(1, 9, 2, generator=g, dtype=D, requires_grad=True)
    h0 = torch.randn(2, 2, 3, generator=g, dtype=D, requires_grad=True)
    cu = torch.tensor([0, 4, 9])

    def f(a, v, h0):
        return ls.scan(ls.Companion(a), v, initial_state=h0, output_final_state=True,
                       cu_seqlens=cu)

    assert torch.autograd.gradcheck(f, (a, v, h0))


@pytest.mark.parametrize("variant", GATE_VARIANTS)
def test_gradcheck_gated_scans(variant):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(1, 6, 2, 2, 3, generator=g, dtype=D)
    z = (z + 0.2 * torch.sign(z)).requires_grad_()
    v = torch.randn(1, 6, 2, 2, generator=g, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, v: ls.bdlru_scan(z, v, variant), (z, v))
    zc = torch.randn(1, 6, 3, 4, generator=g, dtype=D)
    zc = (zc + 0.2 * torch.sign(zc)).requires_grad_()
    vc = torch.randn(1, 6, 3, generator=g, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, v: ls.hlru_scan(z, v, variant), (zc, vc))


def test_backward_does_not_differentiate_through_the_tree():
    """The autograd graph of a scan has one node for the whole scan (the adjoint Function)."""
    op, b, _ = inputs("block_diagonal", T=257)
    A = op.A.clone().requires_grad_()
    h = ls.scan(ls.BlockDiagonal(A), b, method="blelloch")
    assert type(h.grad_fn).__name__ == "_AdjointScanBackward"


def test_double_backward_raises_clearly():
    op, b, _ = inputs("diagonal", T=5)
    a = op.a.clone().requires_grad_()
    h = ls.scan(ls.Diagonal(a), b)
    (ga,) = torch.autograd.grad(h.sum(), a, create_graph=True)
    with pytest.raises(RuntimeError):
        ga.sum().backward()
