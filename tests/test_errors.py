"""Bad input gets a clear error naming the argument, the expectation and what was received."""
import pytest
import torch

import lrnn_scan as ls

D = torch.float64


def test_operator_constructor_errors():
    with pytest.raises(TypeError, match="A must be a torch.Tensor"):
        ls.BlockDiagonal([[1.0]])
    with pytest.raises(ValueError, match=r"A must hold square blocks .* got shape \(2, 5, 3, 4\)"):
        ls.BlockDiagonal(torch.randn(2, 5, 3, 4))
    with pytest.raises(ValueError, match="A must have at least 3 dims"):
        ls.BlockDiagonal(torch.randn(3, 3))
    with pytest.raises(TypeError, match="a must have a real floating dtype"):
        ls.Diagonal(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="real floating"):
        ls.Diagonal(torch.ones(2, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="order m must be >= 1"):
        ls.Companion(torch.ones(2, 3, 0))
    k = torch.nn.functional.normalize(torch.randn(2, 5, 3, 2, 4), dim=-1)
    with pytest.raises(ValueError, match=r"beta must have shape keys.shape\[:-1\]"):
        ls.HouseholderProduct(k, torch.rand(2, 5, 3, 4))
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        ls.HouseholderProduct(k, torch.full((2, 5, 3, 2), 2.5))
    with pytest.raises(ValueError, match="keys must have unit L2 norm"):
        ls.HouseholderProduct(3 * k, torch.rand(2, 5, 3, 2))
    with pytest.raises(ValueError, match="gate must have shape"):
        ls.HouseholderProduct(k, torch.rand(2, 5, 3, 2), torch.rand(2, 5))
    with pytest.raises(TypeError, match="beta has dtype torch.float64 but keys has dtype"):
        ls.HouseholderProduct(k, torch.rand(2, 5, 3, 2, dtype=D))


def test_scan_shape_errors():
    op = ls.BlockDiagonal(torch.randn(2, 5, 3, 4, 4))
    with pytest.raises(ValueError, match=r"b must have shape .*batch_shape=\(2, 5, 3\) and d=4"):
        ls.scan(op, torch.randn(2, 6, 3, 4))
    with pytest.raises(ValueError, match=r"b: dim 3 \(the state\) must have size d=4"):
        ls.scan(op, torch.randn(2, 5, 3, 5))
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 3, 4\)"):
        ls.scan(op, torch.randn(2, 5, 3, 4), initial_state=torch.randn(2, 4))
    with pytest.raises(TypeError, match="b has dtype torch.float64 but op has dtype torch.float32"):
        ls.scan(op, torch.randn(2, 5, 3, 4, dtype=D))
    with pytest.raises(TypeError, match="op must be a lrnn_scan TransitionOperator"):
        ls.scan(torch.randn(2, 5, 3, 4, 4), torch.randn(2, 5, 3, 4))
    with pytest.raises(ValueError, match="method must be one of"):
        ls.scan(op, torch.randn(2, 5, 3, 4), method="fast")
    with pytest.raises(ValueError, match="dim must index a batch dim"):
        ls.scan(op, torch.randn(2, 5, 3, 4), dim=3)


def test_scan_varlen_errors():
    op = ls.Diagonal(torch.rand(1, 10, 4))
    b = torch.randn(1, 10, 4)
    with pytest.raises(ValueError, match="must start at 0, be non-decreasing and end at T=10"):
        ls.scan(op, b, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="1-D int32/int64"):
        ls.scan(op, b, cu_seqlens=torch.tensor([0.0, 10.0]))
    with pytest.raises(ValueError, match="batch size 1"):
        ls.scan(ls.Diagonal(torch.rand(2, 10, 4)), torch.randn(2, 10, 4),
                cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 4\)"):
        ls.scan(op, b, cu_seqlens=torch.tensor([0, 3, 10]), initial_state=torch.zeros(1, 4))


def test_kernel_method_without_cuda_says_why():
    op = ls.BlockDiagonal(torch.randn(2, 5, 3, 4, 4))
    with pytest.raises(ValueError, match="method='kernel': tensors are on cpu"):
        ls.scan(op, torch.randn(2, 5, 3, 4), method="kernel")


def test_compose_errors():
    a = ls.Diagonal(torch.rand(2, 5, 3))
    with pytest.raises(ValueError, match="state sizes differ"):
        ls.compose(a, ls.Diagonal(torch.rand(2, 5, 4)))
    with pytest.raises(TypeError, match="dtypes differ"):
        ls.compose(a, ls.Diagonal(torch.rand(2, 5, 3, dtype=D)))
    with pytest.raises(TypeError, match="expected two TransitionOperators"):
        ls.compose(a, torch.rand(2, 5, 3))


def test_apply_error():
    with pytest.raises(ValueError, match=r"x must have shape \(\*batch_shape, d\)"):
        ls.Diagonal(torch.rand(2, 5, 3)).apply(torch.rand(3))


def test_gated_scan_errors():
    with pytest.raises(ValueError, match=r"last dim 3 != m \+ 1 = 4"):
        ls.bdlru_scan(torch.randn(1, 4, 2, 3, 3), torch.randn(1, 4, 2, 3))
    with pytest.raises(ValueError, match=r"v must have shape logits.shape\[:-1\]"):
        ls.bdlru_scan(torch.randn(1, 4, 2, 3, 4), torch.randn(1, 4, 2, 2))
    with pytest.raises(ValueError, match="unknown gate variant"):
        ls.hlru_scan(torch.randn(1, 4, 2, 3), torch.randn(1, 4, 2), gate="bogus")
    with pytest.raises(ValueError, match=r"logits must have shape \(B, T, N, m \+ 1\)"):
        ls.hlru_scan(torch.randn(4, 2, 3), torch.randn(1, 4, 2))


def test_incomplete_custom_operator_fails_at_construction():
    class Half(ls.TransitionOperator):          # forgets transpose / identity_like / to_dense
        tensor_fields, state_size = ("a",), 1

        def __init__(self, a):
            self.a, self._batch_ndim = a, a.dim()

        def _apply_matrix(self, x):
            return 0.5 * x

    with pytest.raises(TypeError, match="abstract"):
        Half(torch.ones(2, 3))
