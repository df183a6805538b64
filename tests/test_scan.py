"""Blelloch = sequential = a plain Python loop, for every family, any T, both directions."""
import pytest
import torch
from hypothesis import given, strategies as st

import lrnn_scan as ls
from lrnn_scan.testing import FAMILIES, random_operator, rel_err

PRIMES_AND_EDGES = [1, 2, 3, 7, 31, 63, 64, 65, 97, 128, 211, 300]


def loop(op, b, h0=None, reverse=False):
    """The recurrence written out with dense matrices: independent of lrnn_scan's scans."""
    dense = op.to_dense()
    vector = b.dim() == op.batch_ndim + 1
    h = torch.zeros_like(b[:, 0]) if h0 is None else h0
    out = [None] * b.shape[1]
    for t in (reversed(range(b.shape[1])) if reverse else range(b.shape[1])):
        y = dense[:, t] @ (h.unsqueeze(-1) if vector else h)
        h = (y.squeeze(-1) if vector else y) + b[:, t]
        out[t] = h
    return torch.stack(out, 1)


def make(family, T, d=3, seed=0, B=2, H=2, n_h=2):
    g = torch.Generator().manual_seed(seed)
    op = random_operator(family, (B, T, H), d, g, n_h=n_h)
    b = torch.randn(B, T, H, d, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, H, d, generator=g, dtype=torch.float64)
    return op, b, h0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("T", PRIMES_AND_EDGES)
def test_blelloch_equals_sequential_equals_loop(family, T):
    op, b, h0 = make(family, T, seed=T)
    for reverse in (False, True):
        for init in (None, h0):
            ref = loop(op, b, init, reverse)
            for method in ("blelloch", "sequential"):
                h, hT = ls.scan(op, b, initial_state=init, output_final_state=True,
                                reverse=reverse, method=method)
                assert rel_err(h, ref) < 1e-12, (method, reverse)
                assert rel_err(hT, ref[:, 0 if reverse else -1]) < 1e-12


@given(T=st.integers(1, 300), family=st.sampled_from(FAMILIES), d=st.integers(2, 6),
       reverse=st.booleans(), with_h0=st.booleans(), seed=st.integers(0, 1000))
def test_blelloch_equals_loop_random_lengths(T, family, d, reverse, with_h0, seed):
    op, b, h0 = make(family, T, d=d, seed=seed, B=1, H=1)
    init = h0 if with_h0 else None
    assert rel_err(ls.scan(op, b, initial_state=init, reverse=reverse, method="blelloch"),
                   loop(op, b, init, reverse)) < 1e-11


def test_matrix_states_and_dim0_layout():
    g = torch.Generator().manual_seed(0)
    op = random_operator("householder", (2, 40, 3), 6, g, n_h=3)
    b = torch.randn(2, 40, 3, 6, 5, generator=g, dtype=torch.float64)
    assert rel_err(ls.scan(op, b), loop(op, b)) < 1e-12
    # time first, no batch: (T, H, m, m) with dim=0
    A = torch.randn(50, 4, 3, 3, generator=g, dtype=torch.float64) / 3
    x = torch.randn(50, 4, 3, generator=g, dtype=torch.float64)
    h = ls.scan(ls.BlockDiagonal(A), x, dim=0)
    ref = loop(ls.BlockDiagonal(A.unsqueeze(0)), x.unsqueeze(0))[0]
    assert rel_err(h, ref) < 1e-12


def test_companion_newest_component_input_and_output():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 33, 5, 3, generator=g, dtype=torch.float64) / 3
    v = torch.randn(2, 33, 5, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    h, hT = ls.scan(ls.Companion(a), v, initial_state=h0, output_final_state=True)
    assert h.shape == (2, 33, 5) and hT.shape == (2, 5, 3)
    hist = [h0[..., 2], h0[..., 1], h0[..., 0]]          # oldest ... newest
    for t in range(33):
        new = sum(a[:, t, :, i] * hist[-1 - i] for i in range(3)) + v[:, t]
        hist.append(new)
        assert rel_err(h[:, t], new) < 1e-12
    assert rel_err(hT, torch.stack([hist[-1], hist[-2], hist[-3]], -1)) < 1e-12


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("reverse", [False, True])
def test_varlen_equals_separate_sequences(family, reverse):
    cu = torch.tensor([0, 1, 1, 18, 64, 65, 130], dtype=torch.int64)  # empty and length-1 seqs
    op, b, _ = make(family, 130, d=3, seed=5, B=1)
    h0 = torch.randn(6, 2, 3, dtype=torch.float64)
    h, hT = ls.scan(op, b, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                    reverse=reverse)
    for i in range(6):
        s, e = int(cu[i]), int(cu[i + 1])
        if e == s:
            assert torch.equal(hT[i], h0[i])
            continue
        sub = op.select_time(1, slice(s, e))
        ref = loop(sub, b[:, s:e], h0[i:i + 1], reverse)
        assert rel_err(h[:, s:e], ref) < 1e-12
        assert rel_err(hT[i], ref[0, 0 if reverse else -1]) < 1e-12


def test_varlen_gradients_match_separate_sequences():
    cu = torch.tensor([0, 7, 20, 33])
    op, b, _ = make("block_diagonal", 33, seed=2, B=1)
    A = op.A.clone().requires_grad_()
    bb = b.clone().requires_grad_()
    h0 = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    h, hT = ls.scan(ls.BlockDiagonal(A), bb, initial_state=h0, output_final_state=True,
                    cu_seqlens=cu)
    (h.sin().sum() + hT.cos().sum()).backward()
    grads = [A.grad, bb.grad, h0.grad]
    A2, b2, h02 = (t.detach().clone().requires_grad_() for t in (op.A, b, h0))
    total = 0
    for i in range(3):
        s, e = int(cu[i]), int(cu[i + 1])
        hi = loop(ls.BlockDiagonal(A2[:, s:e]), b2[:, s:e], h02[i:i + 1])
        total = total + hi.sin().sum() + hi[:, -1].cos().sum()
    total.backward()
    for g1, g2 in zip(grads, [A2.grad, b2.grad, h02.grad]):
        assert rel_err(g1, g2) < 1e-12


def test_half_precision_inputs_keep_float32_state():
    op, b, _ = make("block_diagonal", 50, seed=1)
    opb = op.map(lambda t: t.to(torch.bfloat16))
    h, hT = ls.scan(opb, b.to(torch.bfloat16), output_final_state=True)
    assert h.dtype == torch.bfloat16 and hT.dtype == torch.float32
    ref = loop(op.map(lambda t: t.to(torch.bfloat16).double()), b.to(torch.bfloat16).double())
    assert rel_err(h, ref) < 5e-3


def test_long_sequence_runs_vectorised():
    """T = 1e5 in well under a second or two: the Blelloch scan has no Python loop over T."""
    op, b, _ = make("block_diagonal", 100_000, d=2, seed=0, B=1, H=2)
    h = ls.scan(op.map(lambda t: t.float()), b.float())
    ref = ls.scan(op, b, method="blelloch")
    assert rel_err(h, ref) < 1e-4
