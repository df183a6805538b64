"""The layers on CUDA (fused gate kernels, Triton scans, chunkwise delta product) against the CPU
float64 reference with the same parameters. Skipped without a GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: the CPU test helpers
from test_models import D, NAMES, make, random_state  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _pair(name, seed=0):
    ref = make(name, torch.float64, seed)
    gpu = make(name, torch.float32, seed).cuda()
    gpu.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    return ref, gpu


def _close(a, b, scale_from, tol=2e-3):
    err = (a.double().cpu() - b.double().cpu()).abs().max().item()
    ref = scale_from.abs().max().item() + 1e-6
    assert err <= tol * ref, f"max error {err:.3g} vs scale {ref:.3g}"


@pytest.mark.parametrize("name", NAMES)
def test_cuda_forward_backward_matches_cpu_fp64(name):
    ref, gpu = _pair(name)
    B, T = 2, 37
    x = torch.randn(B, T, D, dtype=torch.float64)
    s0 = random_state(ref, B)
    xr = x.clone().requires_grad_()
    y_ref, s_ref = ref(xr, s0)
    y_ref.square().sum().backward()
    xg = x.float().cuda().requires_grad_()
    y, s = gpu(xg, {k: v.float().cuda() for k, v in s0.items()})
    y.square().sum().backward()
    _close(y, y_ref, y_ref)
    for k in s_ref:
        _close(s[k], s_ref[k], s_ref[k])
    _close(xg.grad, xr.grad, xr.grad, tol=1e-2)
    for (pn, p), (_, pr) in zip(gpu.named_parameters(), ref.named_parameters()):
        _close(p.grad, pr.grad, pr.grad, tol=1e-2)


@pytest.mark.parametrize("name", NAMES)
def test_cuda_varlen_and_step(name):
    _, gpu = _pair(name)
    cu = torch.tensor([0, 5, 5, 21, 30], device="cuda")
    x = torch.randn(1, 30, D, device="cuda")
    y, s = gpu(x, cu_seqlens=cu)
    for i in range(4):
        a, b = int(cu[i]), int(cu[i + 1])
        if b > a:
            y_i, s_i = gpu(x[:, a:b])
            _close(y[:, a:b], y_i, y_i, tol=1e-3)
            for k in s_i:
                _close(s[k][i:i + 1], s_i[k], s_i[k], tol=1e-3)
    st, ys = None, []
    for t in range(8):
        y_t, st = gpu.step(x[:, t], st)
        ys.append(y_t)
    y8, _ = gpu(x[:, :8])
    _close(torch.stack(ys, 1), y8, y8, tol=1e-3)


@pytest.mark.parametrize("name", ["bdlru-softmax", "hlru-sigmoid", "diag-softmax", "deltaproduct-2",
                                  "gated-deltaproduct-3-neg-ogate", "mamba2", "lstm"])
def test_cuda_bf16_autocast(name):
    _, gpu = _pair(name)
    x = torch.randn(2, 64, D, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, _ = gpu(x)
    y.float().square().mean().backward()
    assert torch.isfinite(y.float()).all() and torch.isfinite(x.grad).all()
