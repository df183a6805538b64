"""Block kernels that pass a block's state between lanes by warp shuffles (``tl.gather``,
``kernels/block_diagonal/shuffles.py``): the forward ring's ``GATHER`` and the one-step backward
``bwd._bd_bwd_gather``, against the fp64 step-by-step reference under the interpreter (outputs,
final state and the gradients of ``A``, ``b``, ``h0``; outputs NaN-poisoned), and their rules."""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from lrnn_scan.kernels.block_diagonal.shuffles import bwd_gather, ring_gather  # noqa: E402
from test_kernels_block_diagonal import (DEV, bd, make, run_check, scanmod,  # noqa: E402
                                         spy_launches, tune_fixture)

_tune = tune_fixture({}, dict(bt=8, bn=16, d=4, lb4_chunk=32))  # the main file's interpreter tiles
_NO_LB = dict(bd2_lookback=False, bd2_bwd_lookback=False, bd4_lookback=False, bd4_bwd_lookback=False)


@pytest.mark.parametrize("m", [2, 3, 4, 5, 8, 12, 16])
@pytest.mark.parametrize("variant", ["ring2", "ring4", "ring8"])
@pytest.mark.parametrize("T", [1, 17, 40])
def test_ring_gather(m, variant, T):
    """The ring forward with the state passed back to the lanes by ``tl.gather`` (``fwd._ring_step``
    ``GATHER``; the default at m = 8), every ring, T shorter and longer than the ring, h0 or not;
    m = 3, 5, 12 below their power of two (padded rows in the layout)."""
    scanmod.TUNE.update(ring_gather=True, variant=variant, **_NO_LB)
    A, b = make(2, T, 5, m, seed=m + T)
    run_check(A, b, torch.randn(2, 5, m).to(DEV) if T % 2 else None, None, 1e-5)


@pytest.mark.parametrize("m", [5, 8])
def test_ring_gather_varlen_chunked(m):
    """m = 8 and m = 5 (padded rows) by default through the gather ring: chunked re-runs from
    carries, varlen with an empty sequence and boundaries inside chunks."""
    scanmod.TUNE.update(chunk=12)
    A, b = make(1, 74, 3, m, seed=3)
    cu = torch.tensor([0, 5, 30, 30, 61, 74], dtype=torch.int64, device=DEV)
    run_check(A, b, torch.randn(5, 3, m).to(DEV), cu, 1e-5)


def test_ring_gather_rule(monkeypatch):
    """``TUNE['ring_gather']``: "auto" (default) m = 8 and m below its power of two up to 8;
    True any m (padded rows below mp);
    False never; anything else a clear error. The default m = 8, 5, 3 forwards launch with it."""
    tune = scanmod.TUNE
    tune.clear()
    assert ring_gather(tune, 8, 8) and not ring_gather(tune, 4, 4) and not ring_gather(tune, 16, 16)
    assert all(ring_gather(tune, m, 4 if m == 3 else 8) for m in (3, 5, 6, 7))
    assert not ring_gather(tune, 12, 16) and not ring_gather(tune, 2, 2)
    tune.update(ring_gather=True)
    assert ring_gather(tune, 4, 4) and ring_gather(tune, 3, 4)
    tune.update(ring_gather=False)
    assert not ring_gather(tune, 8, 8)
    tune.update(ring_gather="yes")
    with pytest.raises(ValueError, match="ring_gather"):
        ring_gather(tune, 8, 8)
    tune.clear()
    for m in (8, 5, 3):
        seen = spy_launches(monkeypatch, "_bd_fwd_ring", lambda grid, kw: kw["GATHER"])
        A, b = make(1, 9, 2, m, seed=5)
        with torch.no_grad():
            bd.block_diagonal_scan(A, b)
        assert seen == [True], (m, seen)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 12, 16])
@pytest.mark.parametrize("T", [1, 17, 40])
def test_bwd_gather(m, T):
    """The one-step backward by shuffles at every power-of-two m (m = 1 through the block
    kernels) and at m = 3, 5, 12 (padded rows), T shorter and longer than a pipeline, with and
    without h0."""
    scanmod.TUNE.update(bwd_variant="v1", bwd_gather=True, diag_variant="ring", **_NO_LB)
    A, b = make(2, T, 5, m, seed=m + T)
    run_check(A, b, torch.randn(2, 5, m).to(DEV) if T % 2 else None, None, 1e-5)


@pytest.mark.parametrize("m", [2, 3, 8])
def test_bwd_gather_varlen_chunked(m):
    """Chunked (carries in and out of every chunk), varlen with an empty sequence and boundaries
    inside chunks; m = 3 (not a power of two: padded rows)."""
    scanmod.TUNE.update(bwd_variant="v1", bwd_gather=True, chunk=12, **_NO_LB)
    A, b = make(1, 74, 3, m, seed=3)
    cu = torch.tensor([0, 5, 30, 30, 61, 74], dtype=torch.int64, device=DEV)
    run_check(A, b, torch.randn(5, 3, m).to(DEV), cu, 1e-5)


def test_bwd_gather_rule(monkeypatch):
    """``TUNE['bwd_gather']``: "auto" (default) m = mp >= 8 and m = 6 below 4 programs an SM;
    True any m; False never; anything else a clear error. Default launches: the one-step
    backward with few programs runs ``_bd_bwd_gather`` at m = 8 and 6; m = 5 and 3 do not."""
    tune = scanmod.TUNE
    tune.clear()
    assert bwd_gather(tune, 8, 8, 100, 132) and bwd_gather(tune, 32, 32, 527, 132)
    assert not bwd_gather(tune, 8, 8, 528, 132) and not bwd_gather(tune, 4, 4, 10, 132)
    assert bwd_gather(tune, 6, 8, 10, 132) and not bwd_gather(tune, 6, 8, 528, 132)
    assert not bwd_gather(tune, 5, 8, 10, 132) and not bwd_gather(tune, 7, 8, 10, 132)
    tune.update(bwd_gather=True)
    assert bwd_gather(tune, 4, 4, 10_000, 132) and bwd_gather(tune, 3, 4, 10, 132)
    tune.update(bwd_gather=False)
    assert not bwd_gather(tune, 8, 8, 10, 132)
    tune.update(bwd_gather=1)
    with pytest.raises(ValueError, match="bwd_gather"):
        bwd_gather(tune, 8, 8, 10, 132)
    tune.clear()
    tune.update(_NO_LB)
    for m, want in ((8, 1), (6, 1), (5, 0), (3, 0)):
        seen = spy_launches(monkeypatch, "_bd_bwd_gather", lambda grid, kw: kw["M"])
        A, b = make(1, 9, 2, m, seed=5)
        run_check(A, b, None, None, 1e-5)
        assert len(seen) == want, (m, seen)
