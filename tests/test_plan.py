"""Property tests of ``kernels/block_diagonal/plan.py`` (no kernel runs): the plan a custom op's
backward recomputes (``backward_plan``, from what the forward left) names the backward the eager
forward's plan (``bd_plan`` / ``diag_plan`` with gradients) chose, over shapes, batch sizes and the
``TUNE`` settings that steer the rules; and the inference plan never needs chunk products from a
look-back forward it did not run."""
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lrnn_scan.kernels.block_diagonal import plan, scan as S

# TUNE settings that move the rules: the defaults, lower chunking thresholds (so short
# sequences chunk), each look-back and TMA path forced on or off, forced chunks
TUNES = [{}, {"chunk_min_len": 64}, {"chunk_min_len": 64, "chunk_grad_below": 8},
         {"chunk": 32}, {"bd2_tma": True, "bd4_tma": True}, {"bd4_tma": True, "bd4_tma_bwd": False},
         {"bd2_lookback": True}, {"bd2_bwd_lookback": True}, {"bd4_lookback": True},
         {"bd4_bwd_lookback": True}, {"bd2_lookback": False, "bd4_lookback": False},
         {"fwd_lookback": True}, {"bwd_lookback": True}, {"diag_tma_bwd": True},
         {"diag_tma_bwd": True, "chunk_min_len": 64, "chunk_grad_below": 8}, {"bwd_lookback": False, "chunk_min_len": 64},
         {"fwd_lookback": True, "chunk_min_len": 64, "chunk_grad_below": 8}, {"bd_lookback": "always"},
         {"fwd_lookback": True, "bwd_lookback": False, "chunk_min_len": 64, "chunk_grad_below": 8,
          "lb_chunk": 256}]


@pytest.fixture(autouse=True)
def _tune():
    saved = dict(S.TUNE)
    yield
    S.TUNE.clear()
    S.TUNE.update(saved)


def _check(m, B, T, H):
    if m == 1:
        b = torch.empty(B, T, H)  # never read: the rules look at shapes, strides, data pointers
        chunk, lookback, bwd = plan.diag_plan(b, B, T, True)
        A = b
    else:
        A, b = torch.empty(B, T, H, m, m), torch.empty(B, T, H, m)
        chunk, lookback, bwd = plan.bd_plan(A, b, B, T, True)
        # the block look-backs and TMA are forward-only passes: they never leave chunk products
        assert not (lookback and chunk is not None), (chunk, lookback)
    assert chunk is None or 0 < chunk < T
    got = plan.backward_plan(A, b, B, T, m == 1, chunk is not None)
    # with the m = 1 look-back backward the forward's chunks (if any) are not read
    want = (None if bwd and m == 1 else chunk, bwd)
    assert got == want, (m, B, T, H, S.TUNE, got, want, lookback)
    return chunk, lookback, bwd


@pytest.mark.parametrize("tune", TUNES, ids=[str(i) for i in range(len(TUNES))])
def test_backward_plan_matches_the_forward_plan(tune):
    """Every ``m`` class (1, 2, 3, 4, 8, 16), lengths from 1 to past the chunking thresholds
    (5001: chunk lengths that the alignments change), few and many programs."""
    S.TUNE.update(tune)
    seen = set()
    for m, T, (B, H) in itertools.product([1, 2, 3, 4, 8, 16], [1, 65, 300, 1500, 5001],
                                          [(1, 1), (1, 40), (3, 7), (9, 40), (2, 16)]):
        chunk, lookback, bwd = _check(m, B, T, H)
        seen.add((chunk is not None, lookback, bwd))
    assert len(seen) > 1, seen  # the rules moved with the shapes


@given(m=st.sampled_from([2, 4, 16]), T=st.sampled_from([65, 300, 5000]), tune=st.sampled_from(TUNES))
def test_inference_plans(m, T, tune):
    """Without gradients no backward follows: the block plan may pick a forward-only look-back,
    and any chunk length is shorter than the sequence."""
    S.TUNE.clear()
    S.TUNE.update(tune)
    A, b = torch.empty(1, T, 6, m, m), torch.empty(1, T, 6, m)
    chunk, lookback, bwd = plan.bd_plan(A, b, 1, T, False)
    assert bwd is False and (chunk is None or 0 < chunk < T)
    assert not (lookback and chunk is not None)
