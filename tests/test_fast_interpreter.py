"""The test suite's interpreter speed-ups (``_fast_interpreter.py``: slice-wise scans and reductions,
no re-patch by helpers inside a launch) give bitwise the results of Triton's own interpreter, on the
library's combine functions (2 x 2 and 4 x 4 affine maps, forward and reverse, both axes) and on
reductions (one axis, all axes, ``keep_dims``); launches leave ``triton.language`` unpatched."""
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("checks Triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

import triton                                                          # noqa: E402
import triton.language as tl                                           # noqa: E402

import _fast_interpreter                                               # noqa: E402
from lrnn_scan.kernels.block_diagonal.lookback2 import _affine2_combine  # noqa: E402
from lrnn_scan.kernels.block_diagonal.lookback4 import _affine4_combine  # noqa: E402


@triton.jit
def _scan2(X, Y, R, AXIS: tl.constexpr, REV: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
    offs = tl.arange(0, BT)[:, None] * BN + tl.arange(0, BN)[None, :]
    xs = ()
    for k in tl.static_range(6):
        xs = xs + (tl.load(X + k * BT * BN + offs),)
    ys = tl.associative_scan(xs, AXIS, _affine2_combine, reverse=REV)
    for k in tl.static_range(6):
        tl.store(Y + k * BT * BN + offs, ys[k])
    # reductions with a user combine: per row, per column kept, and over everything
    tl.store(R + tl.arange(0, BT), tl.reduce(xs[0], 1, _max_abs))
    tl.store(R + BT + tl.arange(0, BN)[None, :], tl.reduce(xs[1], 0, _max_abs, keep_dims=True))
    tl.store(R + BT + BN, tl.reduce(xs[2], None, _max_abs))


@triton.jit
def _max_abs(a, b):
    return tl.maximum(tl.abs(a), tl.abs(b)) + 0.125 * tl.minimum(a, b)


@triton.jit
def _scan4(X, Y, BT: tl.constexpr, BN: tl.constexpr):
    offs = tl.arange(0, BT)[:, None] * BN + tl.arange(0, BN)[None, :]
    xs = ()
    for k in tl.static_range(20):
        xs = xs + (tl.load(X + k * BT * BN + offs),)
    ys = tl.associative_scan(xs, 0, _affine4_combine)
    for k in tl.static_range(20):
        tl.store(Y + k * BT * BN + offs, ys[k])


def _both(run):
    """``run()`` with the interpreter's own functions, then with the speed-ups."""
    ours = {key: getattr(*key) for key in _fast_interpreter.ORIGINALS}
    assert ours, "the speed-ups are not installed (conftest.py)"
    try:
        for (cls, name), fn in _fast_interpreter.ORIGINALS.items():
            setattr(cls, name, fn)
        want = run()
    finally:
        for (cls, name), fn in ours.items():
            setattr(cls, name, fn)
    return want, run()


@pytest.mark.parametrize("axis,rev", [(0, False), (1, False), (0, True), (1, True)])
def test_affine2_scan_and_reduce_bitwise(axis, rev):
    BT, BN = 8, 4
    x = torch.randn(6, BT, BN, generator=torch.Generator().manual_seed(axis + 2 * rev))

    def run():
        y, r = torch.full_like(x, float("nan")), torch.full((BT + BN + 1,), float("nan"))
        _scan2[(1,)](x, y, r, axis, rev, BT, BN)
        return y, r
    (y0, r0), (y1, r1) = _both(run)
    assert torch.equal(y0, y1) and torch.equal(r0, r1)
    assert not torch.isnan(y1).any() and not torch.isnan(r1).any()
    assert not torch.equal(y1, x)


def test_affine4_scan_bitwise():
    BT, BN = 16, 2
    x = torch.randn(20, BT, BN, generator=torch.Generator().manual_seed(4))

    def run():
        y = torch.full_like(x, float("nan"))
        _scan4[(1,)](x, y, BT, BN)
        return y
    y0, y1 = _both(run)
    assert torch.equal(y0, y1) and not torch.isnan(y1).any()


def test_launches_leave_triton_language_unpatched():
    """After a launch (and after one that fails inside a helper) ``triton.language`` holds its own
    builtins again and no launch is recorded as running."""
    x = torch.randn(6, 8, 4)
    _scan2[(1,)](x, torch.empty_like(x), torch.empty(13), 0, False, 8, 4)
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)
    assert _fast_interpreter._PATCHED == []
    with pytest.raises(Exception):
        _scan2[(1,)](x, torch.empty_like(x), torch.empty(13), 2, False, 8, 4)   # axis 2: no such axis
    assert tl.core.is_builtin(tl.load) and _fast_interpreter._PATCHED == []
