"""Test helpers for people who write their own operators (and for our own property tests).

Two things:

* :func:`check_operator_laws` — runs the algebraic laws every transition operator must satisfy
  (apply/compose/transpose agree with the dense form, associativity of the scan combine, identity,
  transpose laws, scan = a plain loop for every method, forward and reverse, with an initial state,
  and adjoint-scan gradients = autograd through the loop). Raises ``AssertionError`` naming the law.
* hypothesis strategies (:func:`operators` and one per family) that draw random built-in
  operators; they need ``hypothesis`` installed (the ``test`` extra).

A user's test file for a custom operator is two lines::

    from lrnn_scan.testing import check_operator_laws
    def test_rotation_laws(): check_operator_laws(Rotation2.random)

where ``Rotation2.random(batch_shape, generator, dtype)`` returns an instance with that batch shape.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from .api import scan
from .operators import (BlockDiagonal, Companion, Diagonal, HouseholderProduct,
                        TransitionOperator, compose)

__all__ = ["check_operator_laws", "rel_err", "random_operator", "FAMILIES", "operators",
           "diagonals", "block_diagonals", "companions", "householder_products",
           "operator_triples"]

FAMILIES = ("diagonal", "block_diagonal", "companion", "householder")
OperatorFactory = Callable[[tuple, torch.Generator, torch.dtype], TransitionOperator]


def rel_err(x: Tensor, ref: Tensor) -> float:
    """Relative RMS error ``‖x − ref‖ / ‖ref‖`` (absolute when ``ref`` is ~0), in float64."""
    x, ref = x.detach().double(), ref.detach().double()
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 1e-300 else num


def _assert_close(name: str, x: Tensor, ref: Tensor, rtol: float) -> None:
    err = rel_err(x, ref)
    if not err <= rtol:  # also catches NaN
        raise AssertionError(f"law '{name}' violated: relative error {err:.3e} > {rtol:.1e}")


def random_operator(family: str, batch_shape: Sequence[int], d: int, generator: torch.Generator,
                    dtype: torch.dtype = torch.float64, n_h: int = 2,
                    gated: bool = True) -> TransitionOperator:
    """A random, well-conditioned (spectral radius ≲ 1) operator of a built-in family."""
    bs = tuple(batch_shape)
    rnd = lambda *s: torch.randn(*s, generator=generator, dtype=dtype)
    uni = lambda *s: torch.rand(*s, generator=generator, dtype=dtype)
    if family == "diagonal":
        return Diagonal(2 * uni(*bs, d) - 1)
    if family == "block_diagonal":
        return BlockDiagonal(rnd(*bs, d, d) / (d ** 0.5 + 1))
    if family == "companion":
        return Companion((2 * uni(*bs, d) - 1) / d)
    if family == "householder":
        keys = torch.nn.functional.normalize(rnd(*bs, n_h, d), dim=-1)
        gate = uni(*bs) if gated else None
        return HouseholderProduct(keys, 2 * uni(*bs, n_h), gate)
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def _loop(op: TransitionOperator, b: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    """The obvious loop with dense matrices (time at dim 1), independent of the scan code."""
    dense = op.to_dense()
    T = b.shape[1]
    vector = b.dim() == op.batch_ndim + 1
    h = torch.zeros_like(b[:, 0]) if h0 is None else h0
    out = [None] * T
    for t in (reversed(range(T)) if reverse else range(T)):
        x = h.unsqueeze(-1) if vector else h
        y = dense[:, t] @ x
        h = (y.squeeze(-1) if vector else y) + b[:, t]
        out[t] = h
    return torch.stack(out, dim=1)


def check_operator_laws(factory: OperatorFactory, *, batch_shape: Sequence[int] = (2, 9, 3),
                        dtype: torch.dtype = torch.float64, rtol: float = 1e-10, seed: int = 0,
                        state_cols: int | None = 3, methods: Sequence[str] = ("blelloch",
                                                                               "sequential"),
                        check_grads: bool = True) -> None:
    """Check the transition-operator laws for operators made by ``factory``.

    Args:
        factory: ``factory(batch_shape, generator, dtype) -> TransitionOperator``; called several
            times (fresh random operators). Time is batch dim 1, so ``batch_shape`` needs ≥ 2 dims.
        batch_shape: e.g. ``(B, T, H)``.
        rtol: relative RMS tolerance for every law (1e-10 suits float64).
        state_cols: also check matrix states ``(*batch, d, c)`` with ``c = state_cols`` (None: skip).
        methods: scan methods compared against the plain loop.
        check_grads: compare the adjoint-scan gradients with autograd through the loop.

    Raises:
        AssertionError naming the first violated law.
    """
    bs = tuple(batch_shape)
    if len(bs) < 2:
        raise ValueError(f"batch_shape needs >= 2 dims (batch, time, ...); got {bs}")
    g = torch.Generator().manual_seed(seed)
    ops = [factory(bs, g, dtype) for _ in range(3)]
    for op in ops:
        if not isinstance(op, TransitionOperator):
            raise AssertionError(f"factory returned {type(op).__name__}, not a TransitionOperator")
        if tuple(op.batch_shape) != bs:
            raise AssertionError(f"factory returned batch_shape {tuple(op.batch_shape)} != {bs}")
    a, b_, c = ops
    d = a.state_size
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    states = [rnd(*bs, d)] + ([rnd(*bs, d, state_cols)] if state_cols else [])

    # apply / compose / transpose agree with the dense form
    for x in states:
        xm = x.unsqueeze(-1) if x.dim() == len(bs) + 1 else x
        ref = (a.to_dense() @ xm).reshape(x.shape)
        _assert_close("apply == dense @ x", a.apply(x), ref, rtol)
        _assert_close("identity_like().apply(x) == x", a.identity_like().apply(x), x, rtol)
        y = rnd(*x.shape)
        lhs = (a.apply(x) * y).sum()
        rhs = (x * a.transpose().apply(y)).sum()
        _assert_close("<A x, y> == <x, A^T y>", lhs.reshape(1), rhs.reshape(1), rtol)
    # a family's closed-form param_grads equals the generic VJP through apply (base class)
    for op in (a, a.transpose()):
        for x in states:
            lam = rnd(*x.shape)
            ref = TransitionOperator.param_grads(op, x, lam)
            for name, got, want in zip(op.tensor_fields, op.param_grads(x, lam), ref):
                if want is not None:
                    _assert_close(f"param_grads()[{name!r}] == VJP of apply", got, want, rtol)
    _assert_close("compose == dense product", compose(a, b_).to_dense(),
                  a.to_dense() @ b_.to_dense(), rtol)
    _assert_close("transpose().to_dense() == to_dense().mT", a.transpose().to_dense(),
                  a.to_dense().mT, rtol)
    _assert_close("(A B)^T == B^T A^T", compose(a, b_).transpose().to_dense(),
                  compose(b_.transpose(), a.transpose()).to_dense(), rtol)
    _assert_close("A^T^T == A", a.transpose().transpose().to_dense(), a.to_dense(), rtol)
    ident = a.identity_like()
    _assert_close("A I == A", compose(a, ident).to_dense(), a.to_dense(), rtol)
    _assert_close("I A == A", compose(ident, a).to_dense(), a.to_dense(), rtol)
    _assert_close("(A B) C == A (B C)", compose(compose(a, b_), c).to_dense(),
                  compose(a, compose(b_, c)).to_dense(), rtol)
    # associativity of the full scan combine (A_j A_i, A_j b_i + b_j) on elements (op, b)
    bi, bj, bk = (rnd(*bs, d) for _ in range(3))
    combine = lambda e1, e2: (compose(e2[0], e1[0]), e2[0].apply(e1[1]) + e2[1])
    left = combine(combine((c, bi), (b_, bj)), (a, bk))
    right = combine((c, bi), combine((b_, bj), (a, bk)))
    _assert_close("combine associativity (operator)", left[0].to_dense(), right[0].to_dense(), rtol)
    _assert_close("combine associativity (input)", left[1], right[1], rtol)

    # scan == loop
    h0_shape = lambda x: x.shape[:1] + x.shape[2:]
    for x in states:
        h0 = rnd(*h0_shape(x))
        for reverse in (False, True):
            ref = _loop(a, x, h0, reverse)
            for method in methods:
                h, hT = scan(a, x, initial_state=h0, output_final_state=True, reverse=reverse,
                             method=method)
                _assert_close(f"scan({method}, reverse={reverse}) == loop", h, ref, rtol)
                _assert_close(f"final state ({method}, reverse={reverse})", hT,
                              ref[:, 0 if reverse else -1], rtol)
    if not check_grads:
        return
    # adjoint-scan gradients == autograd through the dense loop
    x = states[-1]
    h0 = rnd(*h0_shape(x))
    cot = rnd(*x.shape)
    for method in methods:
        params = [t.detach().clone().requires_grad_() for t in a.tensors()]
        xs, h0s = x.clone().requires_grad_(), h0.clone().requires_grad_()
        op = a.with_tensors(*params)
        (scan(op, xs, initial_state=h0s, method=method) * cot).sum().backward()
        params_r = [t.detach().clone().requires_grad_() for t in a.tensors()]
        xr, h0r = x.clone().requires_grad_(), h0.clone().requires_grad_()
        (_loop(a.with_tensors(*params_r), xr, h0r, False) * cot).sum().backward()
        _assert_close(f"grad b ({method})", xs.grad, xr.grad, rtol)
        _assert_close(f"grad initial_state ({method})", h0s.grad, h0r.grad, rtol)
        for i, (p, r) in enumerate(zip(params, params_r)):
            if r.grad is not None:
                _assert_close(f"grad {type(a).tensor_fields[i]} ({method})", p.grad, r.grad, rtol)


# ------------------------------------------------------------------------ hypothesis strategies
def _st():
    try:
        from hypothesis import strategies as st
    except ImportError as exc:  # pragma: no cover - exercised only without hypothesis
        raise ImportError("lrnn_scan.testing strategies need hypothesis: pip install "
                          "'lrnn-scan[test]'") from exc
    return st


def _family_strategy(family: str, max_d: int = 8, max_n_h: int = 4, max_T: int = 12):
    st = _st()

    @st.composite
    def strat(draw):
        d = draw(st.integers(1, max_d))
        T = draw(st.integers(1, max_T))
        B = draw(st.integers(1, 2))
        H = draw(st.integers(1, 3))
        n_h = draw(st.integers(1, max_n_h))
        seed = draw(st.integers(0, 2 ** 31 - 1))
        g = torch.Generator().manual_seed(seed)
        return random_operator(family, (B, T, H), d, g, n_h=n_h, gated=draw(st.booleans()))

    return strat()


def diagonals(max_d: int = 8):
    """Strategy: random :class:`Diagonal` with batch shape ``(B, T, H)``, float64."""
    return _family_strategy("diagonal", max_d)


def block_diagonals(max_d: int = 8):
    """Strategy: random :class:`BlockDiagonal`, ``m`` in ``1..max_d``, float64."""
    return _family_strategy("block_diagonal", max_d)


def companions(max_d: int = 8):
    """Strategy: random :class:`Companion` of order ``1..max_d``, float64."""
    return _family_strategy("companion", max_d)


def householder_products(max_d: int = 8, max_n_h: int = 4):
    """Strategy: random :class:`HouseholderProduct` (``n_h`` in ``1..max_n_h``, gated or not)."""
    return _family_strategy("householder", max_d, max_n_h)


def operators(max_d: int = 8):
    """Strategy: a random operator of any built-in family."""
    st = _st()
    return st.one_of(diagonals(max_d), block_diagonals(max_d), companions(max_d),
                     householder_products(max_d))


def operator_triples(max_d: int = 8, mixed: bool = True):
    """Strategy: three operators with one batch shape and state size — each of a random family
    when ``mixed`` (so mixed compositions are exercised), else all of one family."""
    st = _st()

    @st.composite
    def strat(draw):
        d = draw(st.integers(1, max_d))
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 3)))
        seed = draw(st.integers(0, 2 ** 31 - 1))
        g = torch.Generator().manual_seed(seed)
        fams = [draw(st.sampled_from(FAMILIES))] * 3
        if mixed:
            fams = [draw(st.sampled_from(FAMILIES)) for _ in range(3)]
        n_h = draw(st.integers(1, 4))
        return tuple(random_operator(f, shape, d, g, n_h=n_h) for f in fams)

    return strat()
