"""The Triton L2 normalisation (kernels/l2norm) at layer sizes on CUDA against the fp64 torch
reference: values and gradients, fp32/bf16/fp16, outputs NaN-poisoned. Skipped without a GPU."""
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

os.environ["LRNN_SCAN_POISON"] = "1"


def rel(x, y):
    return ((x.double() - y.double()).norm() / y.double().norm()).item()


@pytest.mark.parametrize("shape", [(8, 2048, 10, 128), (4, 4097, 2, 16, 64), (3, 1000, 96)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 5e-3),
                                       (torch.float16, 1e-3)])
def test_l2norm_full_size(shape, dtype, tol):
    from lrnn_scan.kernels.l2norm import l2_normalize

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(shape, device="cuda", generator=g) * 2).to(dtype).requires_grad_()
    dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
    y = l2_normalize(x)
    (gx,) = torch.autograd.grad(y, x, dy)
    xd = x.detach().double().requires_grad_()
    yr = torch.nn.functional.normalize(xd, dim=-1)
    (gr,) = torch.autograd.grad(yr, xd, dy.double())
    assert y.dtype == dtype and gx.dtype == dtype
    assert not torch.isnan(y).any() and not torch.isnan(gx).any()
    assert rel(y, yr) < tol and rel(gx, gr) < tol, (rel(y, yr), rel(gx, gr))
