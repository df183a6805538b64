"""The block forward that takes steps in pairs (``kernels/block_diagonal/pair.py``, ``TUNE['variant']
= 'pair<D>'``): outputs, final state and the gradients of ``A``, ``b``, ``h0`` against the fp64
step-by-step reference under the interpreter (on a GPU without it), outputs NaN-poisoned, on
lengths shorter and longer than the ring, odd lengths (the last pair half empty), varlen chunks
with an empty sequence, and bad variants."""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import (DEV, make, run_check, scanmod,  # noqa: E402
                                         spy_launches, tune_fixture)

_tune = tune_fixture({}, dict(bt=8, bn=16, d=4, lb4_chunk=32))  # the main file's interpreter tiles
# m = 2, 4 with few programs take the look-backs; the variant key alone already turns TMA off
_NO_LB = dict(bd2_lookback=False, bd4_lookback=False)


@pytest.mark.parametrize("m", [2, 4, 8, 16])
@pytest.mark.parametrize("variant", ["pair2", "pair4", "pair8"])
@pytest.mark.parametrize("T", [1, 2, 17, 40])
def test_pair_forward(m, variant, T, monkeypatch):
    """Every ring depth at every power-of-two ``m`` below 32, with ``h0`` on odd ``T``; the pair
    kernel is the one that ran (one launch, its ring depth ``D``)."""
    seen = spy_launches(monkeypatch, "_bd_fwd_pair", lambda grid, kw: kw["D"])
    scanmod.TUNE.update(variant=variant, **_NO_LB)
    A, b = make(2, T, 5, m, seed=m + T)
    run_check(A, b, torch.randn(2, 5, m).to(DEV) if T % 2 else None, None, 1e-5)
    assert seen == [int(variant[4:])]


@pytest.mark.parametrize("m", [4, 8])
def test_pair_varlen_chunked(m):
    """Chunked re-runs from carries (the carries' own forward runs the pair kernel too), varlen
    with an empty sequence, boundaries inside chunks and odd chunk remainders."""
    scanmod.TUNE.update(variant="pair4", chunk=12, **_NO_LB)
    A, b = make(1, 75, 3, m, seed=3)
    cu = torch.tensor([0, 5, 30, 30, 61, 75], dtype=torch.int64, device=DEV)
    run_check(A, b, torch.randn(5, 3, m).to(DEV), cu, 1e-5)


def test_pair_varlen_unchunked_partial_group():
    """One pass over varlen sequences of odd lengths with ``H`` not a multiple of the blocks a
    program takes (masked rows)."""
    scanmod.TUNE.update(variant="pair2", chunk=0, **_NO_LB)
    A, b = make(1, 23, 3, 8, seed=9)
    cu = torch.tensor([0, 1, 8, 23], dtype=torch.int64, device=DEV)
    run_check(A, b, None, cu, 1e-5)


@pytest.mark.parametrize("m,variant", [(3, "pair4"), (8, "pair3"), (8, "pair16")])
def test_pair_bad_variant(m, variant):
    """``m`` not a power of two, or a ring depth other than 2, 4, 8: a clear error naming the key."""
    scanmod.TUNE.update(variant=variant, **_NO_LB)
    A, b = make(1, 5, 2, m, seed=1)
    with pytest.raises(ValueError, match=r"TUNE\['variant'\].*pair2, pair4 or pair8"):
        scanmod.block_diagonal_scan(A.to(DEV), b.to(DEV))
