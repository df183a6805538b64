"""The Triton row-wise L2 normalisation (kernels/l2norm) against the fp64 torch reference, under
the interpreter on CPU: values, gradients, clamped (near-zero) rows, 16-bit dtypes, odd sizes."""
import os

import pytest
import torch

from lrnn_scan.kernels.l2norm import l2_normalize, l2_normalize_ref
from lrnn_scan.kernels.l2norm import function as fn

os.environ["LRNN_SCAN_POISON"] = "1"   # outputs start as NaN: an unwritten element fails


def rel(x, y):
    """Relative RMS error; absolute where the reference is 0 (K = 1: the gradient vanishes)."""
    d, n = (x.double() - y.double()).norm().item(), y.double().norm().item()
    return d / n if n > 0 else d


def _grads(f, x, dy):
    x = x.detach().clone().requires_grad_()
    y = f(x)
    (gx,) = torch.autograd.grad(y, x, dy)
    return y, gx


@pytest.mark.parametrize("shape", [(1, 1), (3, 5, 7), (2, 9, 4, 128), (130, 33), (4, 1000)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 5e-3),
                                       (torch.float16, 1e-3)])
def test_matches_fp64_reference(shape, dtype, tol):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    x[..., :1, :] *= 1e-3                                       # small-norm rows too
    dy = torch.randn(shape, generator=g).to(dtype)
    assert fn.use_triton(x, fn.l2norm_fwd_kernel)               # really the kernel under test
    y, gx = _grads(l2_normalize, x, dy)
    yr, gr = _grads(lambda t: torch.nn.functional.normalize(t, dim=-1), x.double(), dy.double())
    assert y.dtype == dtype and gx.dtype == dtype and y.shape == x.shape
    assert not torch.isnan(y).any() and not torch.isnan(gx).any()
    assert rel(y, yr) < tol and rel(gx, gr) < tol, (rel(y, yr), rel(gx, gr))


def test_clamped_rows_follow_torch():
    """Rows with ‖x‖ <= eps are scaled by 1/eps (constant): gradient r·dy, no projection."""
    x = torch.randn(6, 16, dtype=torch.float32)
    x[1] = 0.0
    x[2] *= 1e-14
    x[3, :] = 0.0
    x[3, 5] = 2e-13
    dy = torch.randn_like(x)
    y, gx = _grads(l2_normalize, x, dy)
    yr, gr = _grads(lambda t: torch.nn.functional.normalize(t, dim=-1), x.double(), dy.double())
    assert torch.allclose(y.double(), yr, rtol=1e-5, atol=1e-6)
    assert torch.allclose(gx.double(), gr, rtol=1e-5, atol=1e-6 * gr.abs().max().item())


def test_non_contiguous_input_and_custom_eps():
    x = torch.randn(8, 4, 64).transpose(0, 1)                  # (4, 8, 64), not contiguous
    dy = torch.randn(4, 8, 64)
    y, gx = _grads(lambda t: l2_normalize(t, eps=0.5), x * 0.05, dy)
    yr, gr = _grads(lambda t: torch.nn.functional.normalize(t, dim=-1, eps=0.5),
                    (x * 0.05).double(), dy.double())
    assert rel(y, yr) < 1e-6 and rel(gx, gr) < 1e-6


def test_fallbacks_and_errors():
    x64 = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(l2_normalize, (x64,))       # float64: the torch path
    long = torch.randn(2, fn.MAX_K + 1)
    assert torch.allclose(l2_normalize(long), l2_normalize_ref(long))
    assert l2_normalize(torch.randn(3, 0)).shape == (3, 0)
    assert l2_normalize(torch.randn(0, 5)).shape == (0, 5)
    with pytest.raises(TypeError, match="floating-point"):
        l2_normalize(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="eps must be > 0"):
        l2_normalize(torch.randn(3, 4), eps=0.0)
    with pytest.raises(ValueError, match="at least one dim"):
        l2_normalize(torch.tensor(1.0))


def test_delta_api_routes_to_the_kernel_on_kernel_devices(monkeypatch):
    """``lrnn_scan.delta.l2_normalize`` (used by ``use_qk_l2norm`` and the delta layers): the
    kernel on kernel devices (CPU tensors routed to the interpreter here), F.normalize in float32
    elsewhere; 16-bit inputs stay 16-bit under autocast."""
    import lrnn_scan._kernel_modules as km
    from lrnn_scan.delta import l2_normalize as api_l2

    x = torch.randn(2, 5, 3, 32, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_torch = api_l2(x)
    assert y_torch.dtype == torch.bfloat16
    calls, launch = [], fn._launch_fwd
    monkeypatch.setattr(fn, "_launch_fwd", lambda *a: calls.append(1) or launch(*a))
    monkeypatch.setattr(km, "kernel_device", lambda device: True)
    y_kernel = api_l2(x)
    assert calls and y_kernel.dtype == torch.bfloat16
    assert rel(y_kernel, y_torch) < 5e-3


def test_custom_op_under_torch_compile_matches_eager(monkeypatch):
    import lrnn_scan._kernel_modules as km
    import lrnn_scan.compile as lc
    from lrnn_scan.delta import l2_normalize as api_l2

    monkeypatch.setattr(km, "kernel_device", lambda device: True)
    x = torch.randn(3, 7, 2, 64)
    dy = torch.randn_like(x)
    y_e, g_e = _grads(api_l2, x, dy)
    torch._dynamo.reset()
    lc.enable()
    try:
        f = torch.compile(lambda t: api_l2(t) * 2.0, fullgraph=True, backend="aot_eager")
        y_c, g_c = _grads(f, x, dy)
    finally:
        lc.disable()
        torch._dynamo.reset()
    assert rel(y_c, 2 * y_e) < 1e-6 and rel(g_c, 2 * g_e) < 1e-6
