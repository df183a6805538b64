"""Tests of the single-pass look-back forward for blocks (``lookback_dot.py``; opt-in
``TUNE["bd_lookback"] = True``: forwards without gradients that the default would time-chunk).

Triton interpreter, fp64 step-by-step reference, outputs and published values NaN-poisoned
(``LRNN_SCAN_POISON=1``). The interpreter runs programs one at a time in grid order, so no program
spins; ``lb_publish_incl=False`` makes every look-back compose aggregates down to chunk 0. The
GPU test (many tiles in flight, repeated) is where races would show.
"""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402

from lrnn_scan.kernels.block_diagonal import lookback_dot  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")


_tune = tune_fixture(dict(bd_lookback=True, chunk=8, bdlb_chunk=8, sum_prec="ieee"))


def make(B, T, H, m, dtype=torch.float32, seed=0, pool=None):
    """Near-orthogonal transitions ``0.999 Q_t``: chunk products stay O(1), so an error in one (or
    in the order of a composition) reaches every later output. ``make`` of the block-diagonal
    tests contracts: its 8-step products are ~1e-3 and hide such errors. ``pool``: draw the
    ``Q_t`` from that many QR factors (a batched fp64 QR of the 6.3 M blocks of B1 T16384 N768
    m = 2 outlasted a 200 s device stage)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = B * T * H if pool is None else pool
    q, _ = torch.linalg.qr(torch.randn(n, m, m, generator=g, dtype=torch.float64, device=DEV))
    if pool is not None:
        q = q[torch.randint(0, pool, (B * T * H,), generator=g, device=DEV)]
    q = q.reshape(B, T, H, m, m)
    b = torch.randn(B, T, H, m, generator=g, device=DEV)
    return (0.999 * q).to(DEV, dtype).contiguous(), b.to(DEV, dtype).contiguous()


def run(A, b, h0, cu):
    with torch.no_grad():
        h, hf = bd.block_diagonal_scan(A, b, h0, True, cu)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None if h0 is None else h0.double(), True, cu)
    assert not torch.isnan(h).any() and not torch.isnan(hf).any()
    return rel(h, hr), rel(hf, hfr)


@pytest.mark.parametrize("m", [2, 3, 8, 16, 17])
@pytest.mark.parametrize("incl", [True, False])
def test_forward_varlen(m, incl):
    """Varlen with an empty and a one-step sequence, boundaries inside chunks, h0; inclusive
    states published (short look-backs) or not (every look-back composes down to chunk 0)."""
    scanmod.TUNE["lb_publish_incl"] = incl
    A, b = make(1, 61, 3, m, seed=m)
    cu = torch.tensor([0, 5, 30, 30, 31, 61], dtype=torch.int64, device=DEV)
    e = run(A, b, torch.randn(5, 3, m).to(DEV), cu)
    assert max(e) < 1e-5, e


@pytest.mark.parametrize("T", [1, 8, 63, 65])
@pytest.mark.parametrize("nt", [1, 2])
def test_forward_lengths(T, nt):
    """Odd lengths (one step, exactly one chunk, chunk boundaries +-1), batches, two tiles per
    program (H = 5: the last tile is partly past H)."""
    scanmod.TUNE.update(sum_nt=nt)
    A, b = make(2, T, 5, 4, seed=T + nt)
    h0 = torch.randn(2, 5, 4).to(DEV) if T % 2 else None
    # the launcher itself: the routing (test_routing) sends T <= chunk to one sequential pass
    h, hf, _ = lookback_dot.bd_lookback_forward(A, b, h0, None, scanmod.TUNE, scanmod._empty)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None if h0 is None else h0.double(), True)
    assert rel(h, hr) < 1e-5 and rel(hf, hfr) < 1e-5


def test_low_precision():
    A, b = make(1, 40, 3, 8, torch.bfloat16, seed=3)
    with torch.no_grad():
        h, hf = bd.block_diagonal_scan(A, b, None, True)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True)
    assert h.dtype == torch.bfloat16 and 0 < rel(h, hr) <= 5e-3 and rel(hf, hfr) <= 1e-5


def test_status_flags():
    """After one launch every flag of a real chunk is 2 (chunk 0 always; beyond it only with
    ``lb_publish_incl``, else 1), empty chunks past a sequence's end stayed 0, and the counter
    handed out one id per tile."""
    A, b = make(1, 30, 3, 2, seed=5)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int64, device=DEV)
    for incl in (True, False):
        scanmod.TUNE["lb_publish_incl"] = incl
        seen = {}
        real = lookback_dot._bd_lookback_fwd

        class Spy:  # records the status buffer the launcher passes
            def __getitem__(self, grid):
                def launch(*args, **kw):
                    seen["status"], seen["grid"] = args[5], grid
                    return real[grid](*args, **kw)
                return launch
        lookback_dot._bd_lookback_fwd = Spy()
        try:
            h, hf, _ = lookback_dot.bd_lookback_forward(A, b, None, cu, scanmod.TUNE, scanmod._empty)
        finally:
            lookback_dot._bd_lookback_fwd = real
        nc = 3  # max length 21 in chunks of 8; one block group (3 blocks of 2 in a 16 x 16 tile)
        status = seen["status"]
        assert seen["grid"] == (3 * nc,) and status[-1].item() == 3 * nc
        for s, L in enumerate((9, 0, 21)):
            nreal = max(1, -(-L // 8))
            want = [2 if incl or c == 0 else 1 for c in range(nreal)] + [0] * (nc - nreal)
            assert status[s * nc:(s + 1) * nc].tolist() == want, (s, status)
        hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True, cu)
        assert rel(h, hr) < 1e-5 and rel(hf, hfr) < 1e-5


def test_routing(monkeypatch):
    """Only forwards without gradients that would be chunked take the look-back; with gradients
    the chunked forward (it leaves the chunk products the backward needs) runs as before."""
    calls = []
    real = lookback_dot.bd_lookback_forward
    monkeypatch.setattr(scanmod, "bd_lookback_forward", lambda *a: calls.append(1) or real(*a))
    A, b = make(1, 20, 2, 2, seed=1)
    with torch.no_grad():
        bd.block_diagonal_scan(A, b)
    assert calls == [1]
    A.requires_grad_()
    h, _ = bd.block_diagonal_scan(A, b)
    h.sum().backward()
    assert calls == [1] and A.grad is not None
    scanmod.TUNE["chunk"] = 0  # no chunking: one sequential pass, no look-back
    with torch.no_grad():
        bd.block_diagonal_scan(A, b)
    assert calls == [1]
    scanmod.TUNE["bd_lookback"] = "always"  # ... unless forced
    with torch.no_grad():
        e = run(A.detach(), b, None, None)
    assert calls == [1, 1] and max(e) < 1e-5, e
    scanmod.TUNE["bd_lookback"] = "yes"
    with pytest.raises(ValueError, match="bd_lookback"), torch.no_grad():
        bd.block_diagonal_scan(A, b)


@pytest.mark.parametrize("m, want", [(2, False), (15, False), (16, True), (17, True)])
def test_routing_auto(monkeypatch, m, want):
    """The default (``"auto"``): the look-back replaces the chunked forward without gradients from
    ``m = bdlb_min_m`` (16) on; below it the chunked forward runs; never where the forward would
    not chunk, never with gradients."""
    calls = []
    real = lookback_dot.bd_lookback_forward
    monkeypatch.setattr(scanmod, "bd_lookback_forward", lambda *a: calls.append(1) or real(*a))
    scanmod.TUNE.pop("bd_lookback")
    A, b = make(1, 20, 2, m, seed=m)
    with torch.no_grad():
        h, hf = bd.block_diagonal_scan(A, b, None, True)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True)
    assert calls == ([1] if want else []) and max(rel(h, hr), rel(hf, hfr)) < 1e-5
    A.requires_grad_()
    bd.block_diagonal_scan(A, b)[0].sum().backward()
    scanmod.TUNE["chunk"] = 0
    with torch.no_grad():
        bd.block_diagonal_scan(A.detach(), b)
    assert calls == ([1] if want else [])
    scanmod.TUNE.update(chunk=8, bdlb_min_m=2)
    with torch.no_grad():
        bd.block_diagonal_scan(A.detach(), b)
    assert calls == ([1, 1] if want else [1])


def test_bad_chunk():
    scanmod.TUNE["bdlb_chunk"] = 12
    A, b = make(1, 20, 2, 2, seed=1)
    with pytest.raises(ValueError, match="bdlb_chunk"), torch.no_grad():
        bd.block_diagonal_scan(A, b)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("m", [2, 8, 16, 32])
@pytest.mark.parametrize("chunk", [32, 64])
def test_gpu_many_tiles(m, chunk):
    """Thousands of tiles in flight, repeated 3 times: B1 T16384 N768 and varlen, default summary
    precision, against the fp64 loop every time."""
    scanmod.TUNE.clear()
    scanmod.TUNE.update(bd_lookback=True, bdlb_chunk=chunk)
    for B, T, H, cu in ((1, 16384, 768 // m, None),
                        (1, 9000, 256 // m, torch.tensor([0, 1, 4000, 4000, 9000], device=DEV))):
        A, b = make(B, T, H, m, seed=m + chunk, pool=4096)
        h0 = torch.randn(B if cu is None else cu.numel() - 1, H, m, device=DEV)
        hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True, cu)
        for _ in range(3):
            with torch.no_grad():
                h, hf = bd.block_diagonal_scan(A, b, h0, True, cu)
            e = rel(h, hr), rel(hf, hfr)
            assert max(e) < 1e-4, (T, m, e)
