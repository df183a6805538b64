"""Tests of the single-pass look-back forward with one block per thread (``lookback_thread.py``;
opt-in ``TUNE["bd_lookback"] = True, TUNE["bdlb_kind"] = "thread"``: forwards without gradients
that the default would time-chunk, m <= 8).

Triton interpreter, fp64 step-by-step reference, outputs and published values NaN-poisoned
(``LRNN_SCAN_POISON=1``). The interpreter runs programs one at a time in grid order, so no program
spins; ``lb_publish_incl=False`` makes every look-back compose aggregates down to chunk 0.
"""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402
from test_kernels_lookback_dot import make, run  # noqa: E402  (near-orthogonal blocks)

from lrnn_scan.kernels.block_diagonal import lookback_dot, lookback_thread  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")


_tune = tune_fixture(dict(bd_lookback=True, bdlb_kind="thread", chunk=8, lbt_chunk=4))


@pytest.mark.parametrize("m", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("incl", [True, False])
@pytest.mark.parametrize("walk", ["compose", "forward"])
def test_forward_varlen(m, incl, walk):
    """Varlen with an empty and a one-step sequence, boundaries inside chunks, h0; inclusive
    states published (short look-backs) or not (every look-back composes down to chunk 0). H = 3:
    one tile of 32 blocks, most of it past H."""
    scanmod.TUNE.update(lb_publish_incl=incl, lbt_walk=walk)
    A, b = make(1, 37, 3, m, seed=m)
    cu = torch.tensor([0, 5, 22, 22, 23, 37], dtype=torch.int64, device=DEV)
    calls, real = [], lookback_thread._bd_thread_lookback_fwd

    class Spy:  # records the grid: the block scan really took this kernel
        def __getitem__(self, grid):
            return calls.append(grid) or real[grid]
    lookback_thread._bd_thread_lookback_fwd = Spy()
    try:
        e = run(A, b, torch.randn(5, 3, m).to(DEV), cu)
    finally:
        lookback_thread._bd_thread_lookback_fwd = real
    assert calls == [(5 * 5,)], calls  # 5 sequences x 5 chunks of 4 (the longest: 17 steps)
    assert max(e) < 1e-5, e


@pytest.mark.parametrize("T", [1, 4, 15, 17])
@pytest.mark.parametrize("m", [1, 4])
def test_forward_lengths(T, m):
    """Odd lengths (one step, exactly one chunk, chunk boundaries +-1), two sequences, H = 33: two
    tiles a chunk, the second one block wide; the launcher itself (m = 1 scans route to the
    diagonal kernels)."""
    A, b = make(2, T, 33, m, seed=T)
    h0 = torch.randn(2, 33, m).to(DEV) if T % 2 else None
    h, hf, _ = lookback_dot.bd_lookback_forward(A, b, h0, None, scanmod.TUNE, scanmod._empty)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None if h0 is None else h0.double(), True)
    assert rel(h, hr) < 1e-5 and rel(hf, hfr) < 1e-5


def test_low_precision():
    """bf16 inputs and outputs, fp32 state: h within bf16 rounding, the final state exact."""
    A, b = make(1, 30, 3, 8, torch.bfloat16, seed=3)
    with torch.no_grad():
        h, hf = bd.block_diagonal_scan(A, b, None, True)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True)
    assert h.dtype == torch.bfloat16 and 0 < rel(h, hr) <= 5e-3 and rel(hf, hfr) <= 1e-5


@settings(max_examples=10)
@given(T=st.integers(1, 30), chunk=st.integers(1, 9), m=st.integers(1, 8), H=st.sampled_from([1, 3, 33]),
       cuts=st.none() | st.lists(st.integers(0, 30), max_size=3), h0=st.booleans(), incl=st.booleans(),
       walk=st.sampled_from(["compose", "forward"]), seed=st.integers(0, 2**16))
def test_property_equals_sequential(T, chunk, m, H, cuts, h0, incl, walk, seed):
    """Any tile length, block size, length, head count and varlen cut (empty sequences included):
    the launcher's ``h`` and final states equal the fp64 loop."""
    cu = None if cuts is None else torch.tensor(sorted({0, T, *(min(x, T) for x in cuts)}), dtype=torch.int64)
    nseq = 2 if cu is None else cu.numel() - 1
    A, b = make(1 if cu is not None else 2, T, H, m, seed=seed)
    x0 = torch.randn(nseq, H, m, generator=torch.Generator().manual_seed(seed)).to(DEV) if h0 else None
    tune = dict(scanmod.TUNE, lbt_chunk=chunk, lb_publish_incl=incl, lbt_walk=walk)
    cud = None if cu is None else cu.to(DEV)
    h, hf, _ = lookback_dot.bd_lookback_forward(A, b, x0, cud, tune, scanmod._empty)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None if x0 is None else x0.double(), True, cud)
    assert not torch.isnan(h).any() and not torch.isnan(hf).any()
    assert rel(h, hr) < 1e-5 and rel(hf, hfr) < 1e-5, (rel(h, hr), rel(hf, hfr))


def test_bad_settings():
    """A bad kind, chunk or warp count, and a block size past 8, are refused by name."""
    A, b = make(1, 9, 2, 2, seed=1)
    for key, val in (("bdlb_kind", "threads"), ("lbt_chunk", 0), ("lbt_chunk", 2.0), ("lbt_nw", 3),
                     ("lbt_walk", "back")):
        scanmod.TUNE[key] = val
        with pytest.raises(ValueError, match=key):
            lookback_dot.bd_lookback_forward(A, b, None, None, scanmod.TUNE, scanmod._empty)
        scanmod.TUNE.update(bdlb_kind="thread", lbt_chunk=4, lbt_nw=1, lbt_walk="compose")
    A, b = make(1, 9, 1, 9, seed=1)
    with pytest.raises(ValueError, match="m <= 8"):
        lookback_dot.bd_lookback_forward(A, b, None, None, scanmod.TUNE, scanmod._empty)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("m", [4, 6, 8])
@pytest.mark.parametrize("chunk,walk", [(8, "compose"), (32, "compose"), (8, "forward")])
def test_gpu_many_tiles(m, chunk, walk):
    """Thousands of tiles in flight, repeated 3 times: B1 T16384 N768 and varlen with boundaries
    inside chunks and h0, fp32 against the fp64 loop every time; both look-back walks."""
    scanmod.TUNE.clear()
    scanmod.TUNE.update(bd_lookback=True, bdlb_kind="thread", lbt_chunk=chunk, lbt_walk=walk)
    for B, T, H, cu in ((1, 16384, 768 // m, None),
                        (1, 9000, 384 // m, torch.tensor([0, 1, 4003, 4003, 9000], device=DEV))):
        A, b = make(B, T, H, m, seed=m + chunk, pool=4096)
        h0 = torch.randn(B if cu is None else cu.numel() - 1, H, m, device=DEV)
        hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True, cu)
        for _ in range(3):
            with torch.no_grad():
                h, hf = bd.block_diagonal_scan(A, b, h0, True, cu)
            e = rel(h, hr), rel(hf, hfr)
            assert max(e) < 1e-4, (T, m, chunk, walk, e)
