"""``VEC`` of the m = 1 tile kernels (``kernels/_host.diag_vec``): 16-bit inputs load at most 4
channels a lane (fp32's layout), fp32 none; TUNE ``diag_vec`` / ``diag_vec_bwd`` override it.

Every tile launch that reads the inputs gets it (one-pass and chunked forward, one-pass and
chunked backward); the launches over fp32 chunk carries keep the kernel's default. Outputs and
all gradients against the fp64 reference with the cap and without it, NaN-poisoned outputs
(``LRNN_SCAN_POISON=1``). On a GPU the cap changes the in-tile scan's association order, so the
two runs agree to rounding, not bit for bit."""
import os

os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, rel, scanmod, tune_fixture  # noqa: E402
from test_kernels_lookback import grad_check  # noqa: E402

from lrnn_scan.kernels._host import diag_vec  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and DEV != "cuda",
                                reason="needs TRITON_INTERPRET=1 or a GPU")

_tune = tune_fixture(dict(diag_tma=False, fwd_lookback=False, bwd_lookback=False), dict(bt=8, bn=16))


def test_rule():
    assert [diag_vec(s, {}) for s in (4, 2, 8)] == [0, 4, 0]
    assert diag_vec(2, {}, bwd=True) == 4 and diag_vec(4, {}, bwd=True) == 0
    # the backward only up to 4 programs an SM (its capped tiles fit fewer an SM)
    assert [diag_vec(2, {}, True, p) for p in (1.5, 4, 4.5, float("inf"))] == [4, 4, 0, 0]
    assert [diag_vec(2, {}, True, 2, bt) for bt in (16, 32, 64)] == [4, 4, 0]   # and <= 32 steps
    assert diag_vec(2, {"diag_vec": 0}) == 0 == diag_vec(2, {"diag_vec": 0}, bwd=True)
    assert diag_vec(2, {"diag_vec_bwd": 0}) == 4 and diag_vec(2, {"diag_vec_bwd": 0}, bwd=True) == 0
    assert diag_vec(4, {"diag_vec": 2}, bwd=True) == 2 and diag_vec(4, {"diag_vec": 2}, True, 5) == 0
    assert diag_vec(2, {"diag_vec_bwd": 4}, True, float("inf")) == 4


def _spy(monkeypatch, kernels=((scanmod, "_diag_fwd_kernel"), (scanmod, "_diag_bwd_kernel"))):
    """``(kernel, VEC)`` of every launch of ``kernels`` (module, name), "fwd" / "bwd" from the
    name; VEC None where the launch leaves it to the kernel's default, 0."""
    seen = []
    for module, name in kernels:
        real = getattr(module, name)

        class Spy:
            def __getitem__(self, grid, real=real, name=name):
                def launch(*args, **kw):
                    seen.append(("fwd" if "fwd" in name else "bwd", kw.get("VEC")))
                    return real[grid](*args, **kw)
                return launch
        monkeypatch.setattr(module, name, Spy())
    return seen


def _inputs(dtype):
    gen = torch.Generator().manual_seed(5)   # a in (-1, 1), as the GPU tests' (``make``): with
    a = (2 * torch.rand(2, 37, 40, generator=gen) - 1).to(DEV, dtype)   # |a| ~ 1 bf16's rounded h
    b = torch.randn(2, 37, 40, generator=gen).to(DEV, dtype)           # costs da 6e-3 either way
    return a, b, torch.randn(2, 40, device=DEV)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3),
                                       (torch.float16, 5e-3)])
@pytest.mark.parametrize("chunk", [0, 16])
def test_every_tile_launch(dtype, tol, chunk, monkeypatch):
    spied = _spy(monkeypatch)
    monkeypatch.setattr(scanmod, "_num_sms", lambda device: 4)   # the same grids on a GPU
    scanmod.TUNE.update(chunk=chunk, bt=8, bn=16)
    a, b, h0 = _inputs(dtype)
    cap = 4 if dtype != torch.float32 else 0
    runs = []
    # backward grid (4 SMs, 8 x 16 tiles): 2 x 3 programs (1.5 an SM) in one
    # pass, 2 x 3 x 3 chunks (4.5 an SM) chunked: past 4 an SM the backward takes no cap
    bwd_cap = 0 if chunk else cap
    for tune in ({}, {"diag_vec": 0}, {"diag_vec_bwd": 0}, {"diag_vec_bwd": 4}):
        with scanmod.tuned(tune):
            spied.clear()
            # gradients of 16-bit inputs within 1e-2: da reads the h the forward stored in 16 bits
            errs = grad_check(a, b, h0, None, 1e-2 if cap else tol)   # (3e-3 off here) and rounds
            assert max(errs[:2]) < tol, errs                           # again: 6e-3 for bf16
            launched = list(spied)
            runs.append(bd.diagonal_scan(a, b, h0, True))
        seen = launched
        fwd = 0 if "diag_vec" in tune else cap
        bwd = tune.get("diag_vec_bwd", 0 if "diag_vec" in tune else bwd_cap)
        if chunk:   # pass 1 and 3 read the inputs, pass 2 the fp32 chunk carries (forward and backward)
            assert seen == [("fwd", fwd), ("fwd", None), ("fwd", fwd),
                            ("bwd", bwd), ("fwd", None), ("bwd", bwd)], seen
        else:
            assert seen == [("fwd", fwd), ("bwd", bwd)], seen
    for u, v in zip(*runs[:2]):
        assert rel(u, v) < tol


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
def test_lookback_launches(dtype, tol, monkeypatch):
    """The m = 1 look-back forward and backward (lookback.py, lookback_bwd.py) take the same
    rule, the backward's whatever its grid."""
    from lrnn_scan.kernels.block_diagonal import lookback, lookback_bwd
    seen = _spy(monkeypatch, ((lookback, "_diag_lookback_fwd"), (lookback_bwd, "_diag_lookback_bwd")))
    scanmod.TUNE.update(fwd_lookback=True, bwd_lookback=True, lb_chunk=16, lb_bn=16)
    a, b, h0 = _inputs(dtype)
    cap = 4 if dtype != torch.float32 else 0
    for tune, want, want_bwd in (({}, cap, cap), ({"diag_vec": 0}, 0, 0), ({"diag_vec_bwd": 0}, cap, 0)):
        with scanmod.tuned(tune):
            seen.clear()
            errs = grad_check(a, b, h0, None, 1e-2 if cap else tol)   # 1e-2: as above
            assert max(errs[:2]) < tol, errs
            assert seen == [("fwd", want), ("bwd", want_bwd)], seen
