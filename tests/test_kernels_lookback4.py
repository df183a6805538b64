"""Tests of the ``m = 4`` look-back forward (``lookback4.py``; opt-in ``TUNE["bd4_lookback"]``).

Triton interpreter, fp64 step-by-step reference, outputs and published values NaN-poisoned
(``LRNN_SCAN_POISON=1``). The interpreter runs programs one at a time in grid order, so no program
spins; ``lb_publish_incl=False`` makes every look-back compose maps down to chunk 0. The GPU test
(many tiles in flight, repeated) is where races would show.
"""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod  # noqa: E402
from test_kernels_lookback_dot import make  # noqa: E402  (near-orthogonal blocks: products stay O(1))

from lrnn_scan.kernels.block_diagonal import lookback4  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")


@pytest.fixture(autouse=True)
def _tune():
    saved = dict(scanmod.TUNE)
    scanmod.TUNE.clear()
    scanmod.TUNE.update(lb4_chunk=4)
    yield
    scanmod.TUNE.clear()
    scanmod.TUNE.update(saved)


def launch(A, b, h0=None, cu=None):
    h, hf, p = lookback4.bd4_lookback_forward(A, b, h0, cu, scanmod.TUNE, scanmod._empty)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None if h0 is None else h0.double(), True, cu)
    assert p is None and not torch.isnan(h).any() and not torch.isnan(hf).any()
    return rel(h, hr), rel(hf, hfr)


@pytest.mark.parametrize("T", [1, 4, 9, 17])
@pytest.mark.parametrize("window", [1, 2, 4])
def test_lengths_windows(T, window):
    """Odd lengths (one step, one chunk, chunk boundaries +-1), two sequences, H = 40 (the second
    block group is mostly past H), h0 on odd T; every look-back composes down to chunk 0."""
    scanmod.TUNE.update(lb4_window=window, lb_publish_incl=False)
    A, b = make(2, T, 40, 4, seed=T + window)
    h0 = torch.randn(2, 40, 4).to(DEV) if T % 2 else None
    e = launch(A, b, h0)
    assert max(e) < 1e-5, e


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("incl", [True, False])
@pytest.mark.parametrize("chunk", [4, 8])
def test_varlen(incl, chunk, keep):
    """Varlen with an empty and a one-step sequence, boundaries inside chunks, h0 (an empty
    sequence's final state is its h0); ``lb4_keep``: ``h`` from the first scan's rows."""
    scanmod.TUNE.update(lb_publish_incl=incl, lb4_chunk=chunk, lb4_keep=keep)
    A, b = make(1, 37, 3, 4, seed=chunk)
    cu = torch.tensor([0, 5, 20, 20, 21, 37], dtype=torch.int64, device=DEV)
    e = launch(A, b, torch.randn(5, 3, 4).to(DEV), cu)
    assert max(e) < 1e-5, e


def test_low_precision():
    A, b = make(2, 19, 3, 4, torch.bfloat16, seed=3)
    h, hf, _ = lookback4.bd4_lookback_forward(A, b, None, None, scanmod.TUNE, scanmod._empty)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True)
    assert h.dtype == torch.bfloat16 and 0 < rel(h, hr) <= 5e-3 and rel(hf, hfr) <= 1e-5


def test_routing(monkeypatch):
    """``TUNE["bd4_lookback"] = True`` routes ``m = 4`` forwards here, with gradients too (the
    backward is then the one-pass ring one), against fp64 autograd; off by default and for other
    block sizes."""
    calls = []
    real = lookback4.bd4_lookback_forward
    monkeypatch.setattr(scanmod, "bd4_lookback_forward", lambda *a: calls.append(1) or real(*a))
    A, b = make(2, 21, 3, 4, seed=1)
    h0 = torch.randn(2, 3, 4).to(DEV)
    with torch.no_grad():
        bd.block_diagonal_scan(A, b)
    assert calls == []
    scanmod.TUNE.update(bd4_lookback=True)
    Ag, bg, h0g = (x.clone().requires_grad_() for x in (A, b, h0))
    h, hf = bd.block_diagonal_scan(Ag, bg, h0g, True)
    (h * torch.cos(h)).sum().add(hf.square().sum()).backward()
    assert calls == [1]
    Ar, br, h0r = (x.double().clone().requires_grad_() for x in (A, b, h0))
    hr, hfr = ref.block_diagonal_scan_ref(Ar, br, h0r, True)
    (hr * torch.cos(hr)).sum().add(hfr.square().sum()).backward()
    assert max(rel(h, hr), rel(hf, hfr)) < 1e-5
    for x, y in ((Ag, Ar), (bg, br), (h0g, h0r)):
        assert rel(x.grad, y.grad) < 1e-5
    A2, b2 = make(2, 9, 3, 2, seed=4)
    with torch.no_grad():
        bd.block_diagonal_scan(A2, b2)
    assert calls == [1]


def test_config_and_errors():
    assert lookback4.bd4_lookback_cfg({}) == (8, 32, 2, 1)
    assert lookback4.bd4_lookback_cfg({"lb4_bh": 64, "lb4_chunk": 16}) == (16, 64, 2, 2)
    for key, val in (("lb4_chunk", 12), ("lb4_window", 3), ("lb4_bh", 48), ("lb4_bh", 16)):
        with pytest.raises(ValueError, match=key):
            lookback4.bd4_lookback_cfg({key: val})
    with pytest.raises(ValueError, match="bd4_lookback"):
        lookback4.bd4_lookback_use({"bd4_lookback": "yes"}, 4, False)
    A, b = make(1, 5, 2, 3, seed=0)
    with pytest.raises(ValueError, match="4 x 4"):
        lookback4.bd4_lookback_forward(A, b, None, None, {}, scanmod._empty)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("cfg", [dict(), dict(lb4_chunk=16), dict(lb4_window=1), dict(lb4_chunk=4, lb4_window=4),
                                 dict(lb4_bh=64), dict(lb_publish_incl=False), dict(lb4_chunk=4, lb4_keep=True)])
def test_gpu_many_tiles(cfg):
    """B8 T2048 N768, B1 T16384 N768 and varlen (an empty and a one-step sequence), with h0, three
    times each against the fp64 reference: a race shows as a wrong or run-to-run different h."""
    scanmod.TUNE.clear()
    scanmod.TUNE.update(cfg)
    for B, T, H, cu in ((8, 2048, 192, None), (1, 16384, 192, None),
                        (1, 9000, 64, torch.tensor([0, 1, 4000, 4000, 9000], device=DEV))):
        A, b = make(B, T, H, 4, seed=T, pool=4096)
        h0 = torch.randn(B if cu is None else cu.numel() - 1, H, 4, device=DEV)
        for _ in range(3):
            e = launch(A, b, h0, cu)
            assert max(e) < 1e-5, (B, T, cfg, e)
