"""CPU tests of the opt-in single-pass look-back forwards (``TUNE["fwd_lookback"]``): m = 1
(``lookback.py``) and blocks m = 2..8 (``lookback_block.py``, the ``test_block_*`` tests).

Triton interpreter, fp64 step-by-step reference, every output NaN-poisoned before the kernels run
(``LRNN_SCAN_POISON=1``; the look-back's published values are poisoned too, so reading one before
its flag would show). Small look-back chunks (8-32 steps) make many chunks and windows of 1-4
chunks make the look-back take several steps. The interpreter runs programs one at a time in
grid order, so no program ever spins; ``lb_publish_incl=False`` makes every look-back walk over
aggregates down to chunk 0 instead.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod  # noqa: E402

from lrnn_scan.kernels.block_diagonal import lookback  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")


@pytest.fixture(autouse=True)
def _tune():
    saved = dict(scanmod.TUNE)
    scanmod.TUNE.clear()
    scanmod.TUNE.update(fwd_lookback=True, lb_chunk=16, lb_bn=16, lb_window=4)
    if DEV == "cpu":  # small tiles for the backward kernels too (interpreter speed)
        scanmod.TUNE.update(bt=8, bn=16)
    yield
    scanmod.TUNE.clear()
    scanmod.TUNE.update(saved)


def inputs(B, T, N, dtype=torch.float32, seed=0):
    """|a| in [0.97, 1] with random signs: carries from far chunks still matter (with |a| ~ U(0, 1)
    a wrong composition of old aggregates would hide under the tolerance)."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, (B, T, N), generator=g) * 2 - 1
    a = sign * (0.97 + 0.03 * torch.rand(B, T, N, generator=g))
    b = torch.randn(B, T, N, generator=g)
    return a.to(DEV, dtype).contiguous(), b.to(DEV, dtype).contiguous()


def fwd_errors(a, b, h0, cu):
    h, hf = bd.diagonal_scan(a, b, h0, True, cu)
    assert h.shape == b.shape and h.dtype == b.dtype and hf.dtype == torch.float32
    assert not torch.isnan(h).any() and not torch.isnan(hf).any()
    hr, hfr = ref.diagonal_scan_ref(a.double(), b.double(), None if h0 is None else h0.double(), True, cu)
    return rel(h, hr), rel(hf, hfr)


def spy(monkeypatch):
    """Counts launches of the look-back kernel (proves the variant ran)."""
    calls = []
    real = lookback.launch_diag_lookback

    def wrapped(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(lookback, "launch_diag_lookback", wrapped)
    return calls


@pytest.mark.parametrize("T,window,h0", [(1, 4, True), (17, 1, False), (64, 2, True),
                                         (129, 4, False), (300, 16, True)])
def test_forward(T, window, h0, monkeypatch):
    calls = spy(monkeypatch)
    scanmod.TUNE["lb_window"] = window
    a, b = inputs(2, T, 21, seed=T)
    e = fwd_errors(a, b, torch.randn(2, 21).to(DEV) if h0 else None, None)
    assert max(e) < 1e-5, e
    assert calls == [1]


@pytest.mark.parametrize("chunk,incl,window", [(8, True, 4), (8, False, 2), (32, False, 1)])
def test_varlen(chunk, incl, window):
    """Boundaries inside chunks, an empty sequence (its final state is h0), a one-step sequence;
    ``incl=False``: only aggregates are published beyond chunk 0, so the look-backs compose
    aggregates over several windows."""
    scanmod.TUNE.update(lb_chunk=chunk, lb_publish_incl=incl, lb_window=window)
    a, b = inputs(1, 129, 20, seed=chunk)
    cu = torch.tensor([0, 7, 40, 40, 41, 100, 129], dtype=torch.int64, device=DEV)
    for h0 in (torch.randn(6, 20).to(DEV), None):
        e = fwd_errors(a, b, h0, cu)
        assert max(e) < 1e-5, e


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    """16-bit inputs and h, fp32 accumulation and final state: the error is the output rounding."""
    a, b = inputs(2, 70, 20, dtype=dtype, seed=5)
    eh, ef = fwd_errors(a, b, torch.randn(2, 20).to(DEV), None)
    assert 0 < eh <= 5e-3 and ef <= 1e-5, (eh, ef)


def test_status_flags():
    """After one launch every flag of a real chunk is 2, every empty chunk past a sequence's end
    (varlen) stayed 0 and the counter handed out one id per tile; ``lb_publish_incl=False``
    leaves 1 beyond chunk 0."""
    scanmod.TUNE.update(lb_chunk=8, lb_bn=16)
    a, b = inputs(1, 50, 20, seed=2)
    cu = torch.tensor([0, 9, 9, 50], dtype=torch.int64, device=DEV)
    lens = [9, 0, 41]
    for incl in (True, False):
        scanmod.TUNE["lb_publish_incl"] = incl
        h, hf, status, vals, (ch, bn, nc, gn) = lookback.launch_diag_lookback(
            a, b, None, cu, scanmod.TUNE, scanmod._empty)
        assert (nc, gn) == (6, 2) and status.numel() == 3 * gn * nc + 1
        assert status[-1].item() == 3 * gn * nc
        flags = status[:-1].view(3, gn, nc)
        for s, L in enumerate(lens):
            nreal = max(1, -(-L // ch))
            want = [2 if incl or c == 0 else 1 for c in range(nreal)] + [0] * (nc - nreal)
            assert flags[s].tolist() == [want] * gn, (s, flags[s])
        hr, hfr = ref.diagonal_scan_ref(a.double(), b.double(), None, True, cu)
        assert rel(h, hr) < 1e-5 and rel(hf, hfr) < 1e-5


def grad_check(a, b, h0, cu, tol=1e-5):
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    h0 = None if h0 is None else h0.clone().requires_grad_()
    h, hf = bd.diagonal_scan(a, b, h0, True, cu)
    gen = torch.Generator().manual_seed(1)
    g, gf = torch.randn(h.shape, generator=gen).to(DEV), torch.randn(hf.shape, generator=gen).to(DEV)
    ins = [x for x in (a, b, h0) if x is not None]
    grads = torch.autograd.grad((h.float() * g).sum() + (hf * gf).sum(), ins)
    ins_d = [x.detach().double().requires_grad_() for x in ins]
    hr, hfr = ref.diagonal_scan_ref(ins_d[0], ins_d[1], ins_d[2] if h0 is not None else None, True, cu)
    rgrads = torch.autograd.grad((hr * g.double()).sum() + (hfr * gf.double()).sum(), ins_d)
    errs = [rel(h, hr), rel(hf, hfr)] + [rel(x, y) for x, y in zip(grads, rgrads)]
    assert all(not torch.isnan(x).any() for x in grads)
    assert max(errs) < tol, errs
    return errs


@pytest.mark.parametrize("chunk", [0, 32, 20])
def test_gradients(chunk, monkeypatch):
    """Autograd with the variant on: one-pass backward (chunk 0), chunked backward with chunk
    products taken from the look-back tiles (32 = 2 tiles) or from an extra summary pass (20),
    varlen with an empty sequence."""
    calls = spy(monkeypatch)
    scanmod.TUNE["chunk"] = chunk
    a, b = inputs(1, 77, 20, seed=chunk)
    grad_check(a, b, torch.randn(1, 20).to(DEV), None)
    cu = torch.tensor([0, 5, 30, 30, 77], dtype=torch.int64, device=DEV)
    grad_check(a, b, torch.randn(4, 20).to(DEV), cu)
    assert len(calls) == 2


def test_chunk_products_from_tiles():
    """The backward's chunk products from the tiles equal those of the summary pass."""
    a, b = inputs(1, 90, 20, seed=4)
    cu = torch.tensor([0, 33, 33, 90], dtype=torch.int64, device=DEV)
    _, _, P = lookback.diag_lookback_forward(a, b, None, cu, 48, scanmod.TUNE, scanmod._empty,
                                             scanmod._diag_cfg)
    _, _, P2 = lookback.diag_lookback_forward(a, b, None, cu, 40, scanmod.TUNE, scanmod._empty,
                                              scanmod._diag_cfg)  # 40: summary pass
    for c, (x, y) in enumerate(((0, 33), (33, 33), (33, 90))):
        want = torch.stack([a[0, t0:min(t0 + 48, y)].double().prod(0) for t0 in range(x, max(y, x + 1), 48)])
        assert rel(P[c, :want.shape[0]], want) < 1e-6
        want = torch.stack([a[0, t0:min(t0 + 40, y)].double().prod(0) for t0 in range(x, max(y, x + 1), 40)])
        assert rel(P2[c, :want.shape[0]], want) < 1e-6


def test_off_by_default(monkeypatch):
    calls = spy(monkeypatch)
    scanmod.TUNE.pop("fwd_lookback")
    a, b = inputs(1, 20, 20)
    bd.diagonal_scan(a, b)
    assert calls == []
    with pytest.raises(ValueError, match="power of two"):
        lookback.lookback_cfg({"lb_chunk": 24})


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("chunk,window", [(32, 16), (64, 1), (64, 16), (128, 32)])
def test_gpu_many_tiles(chunk, window):
    """Thousands of tiles in flight (spins, aggregates, windows), repeated: B1 T16384 N768, B8
    T2048 N768, varlen; every run must match the fp64 reference."""
    scanmod.TUNE.update(lb_chunk=chunk, lb_bn=32, lb_window=window)
    for B, T, N, cu in ((1, 16384, 768, None), (8, 2048, 768, None),
                        (1, 9000, 256, torch.tensor([0, 1, 4000, 4000, 9000], device=DEV))):
        a, b = inputs(B, T, N, seed=chunk + window)
        h0 = torch.randn(B if cu is None else cu.numel() - 1, N, device=DEV)
        hr, hfr = ref.diagonal_scan_ref(a.double(), b.double(), h0.double(), True, cu)
        for _ in range(5):
            h, hf = bd.diagonal_scan(a, b, h0, True, cu)
            e = rel(h, hr), rel(hf, hfr)
            assert max(e) < 1e-5, (B, T, N, e)


# ----------------------------------------------------------------------------- blocks, m = 2..8
from lrnn_scan.kernels.block_diagonal import lookback_block  # noqa: E402
from test_kernels_block_diagonal import run_check  # noqa: E402


def block_inputs(B, T, H, m, dtype=torch.float32, seed=0):
    """``A_t = s_t Q_t``, ``Q_t`` random orthogonal, ``s_t`` in [0.97, 1]: the state's norm barely
    decays, so carries from far chunks (and every entry of ``P``) still matter."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(B, T, H, m, m, generator=g, dtype=torch.float64))
    A = q * (0.97 + 0.03 * torch.rand(B, T, H, 1, 1, generator=g, dtype=torch.float64))
    b = torch.randn(B, T, H, m, generator=g)
    return A.to(DEV, dtype).contiguous(), b.to(DEV, dtype).contiguous()


def block_errors(A, b, h0, cu):
    h, hf = bd.block_diagonal_scan(A, b, h0, True, cu)
    assert h.shape == b.shape and h.dtype == b.dtype and hf.dtype == torch.float32
    assert not torch.isnan(h).any() and not torch.isnan(hf).any()
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None if h0 is None else h0.double(),
                                          True, cu)
    return rel(h, hr), rel(hf, hfr)


def block_spy(monkeypatch):
    calls = []
    real = lookback_block.launch_block_lookback

    def wrapped(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(lookback_block, "launch_block_lookback", wrapped)
    return calls


@pytest.fixture
def _bd_tune():
    """3 blocks in tiles of 2 (a masked block), 16-step chunks."""
    scanmod.TUNE.update(lb_chunk=16, lb_bh=2)


@pytest.mark.parametrize("m", [2, 3, 4, 8])
@pytest.mark.parametrize("T", [1, 17, 64, 129])
def test_block_forward(m, T, monkeypatch, _bd_tune):
    calls = block_spy(monkeypatch)
    A, b = block_inputs(2, T, 3, m, seed=10 * m + T)
    h0 = torch.randn(2, 3, m).to(DEV) if T % 2 else None
    e = block_errors(A, b, h0, None)
    assert max(e) < 1e-5, e
    assert calls == [1]


@pytest.mark.parametrize("m,chunk,incl", [(2, 8, True), (3, 16, False), (4, 8, False), (8, 32, True)])
def test_block_varlen(m, chunk, incl, _bd_tune):
    """Boundaries inside chunks, an empty sequence (final = h0 or 0), a one-step sequence;
    ``incl=False``: beyond chunk 0 only aggregates are published, every look-back walks over
    flag-1 chunks down to chunk 0."""
    scanmod.TUNE.update(lb_chunk=chunk, lb_publish_incl=incl)
    A, b = block_inputs(1, 129, 3, m, seed=m + chunk)
    cu = torch.tensor([0, 7, 40, 40, 41, 100, 129], dtype=torch.int64, device=DEV)
    for h0 in (torch.randn(6, 3, m).to(DEV), None):
        e = block_errors(A, b, h0, cu)
        assert max(e) < 1e-5, e


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_low_precision(dtype, _bd_tune):
    """16-bit inputs and h, fp32 accumulation and final state: the error is the output rounding."""
    A, b = block_inputs(2, 70, 3, 4, dtype=dtype, seed=5)
    eh, ef = block_errors(A, b, torch.randn(2, 3, 4).to(DEV), None)
    assert 0 < eh <= 5e-3 and ef <= 1e-5, (eh, ef)


def test_block_status_flags(_bd_tune):
    """Every real chunk's flag ends at 2 (1 beyond chunk 0 with ``lb_publish_incl=False``), empty
    chunks past a sequence's end stay 0, one id per tile; the tiles' ``P`` are the products."""
    scanmod.TUNE.update(lb_chunk=8)
    A, b = block_inputs(1, 50, 3, 3, seed=2)
    cu = torch.tensor([0, 9, 9, 50], dtype=torch.int64, device=DEV)
    lens = [9, 0, 41]
    for incl in (True, False):
        scanmod.TUNE["lb_publish_incl"] = incl
        h, hf, status, vals, meta = lookback_block.launch_block_lookback(
            A, b, None, cu, scanmod.TUNE, scanmod._empty, scanmod._bd_cfg)
        ch, mp, bh, nc, gh = meta
        assert (ch, mp, bh, nc, gh) == (8, 4, 2, 6, 2) and status[-1].item() == 3 * gh * nc
        flags = status[:-1].view(3, gh, nc)
        for s, L in enumerate(lens):
            nreal = max(1, -(-L // ch))
            want = [2 if incl or c == 0 else 1 for c in range(nreal)] + [0] * (nc - nreal)
            assert flags[s].tolist() == [want] * gh, (s, flags[s])
        hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True, cu)
        assert rel(h, hr) < 1e-5 and rel(hf, hfr) < 1e-5
        P = lookback_block.tile_products(vals, 3, 3, 3, 8, meta)
        want = torch.eye(3, dtype=torch.float64).expand(3, 3, 3).clone()
        for t in range(17, 25):
            want = A[0, t].double() @ want
        assert rel(P[2, 1], want) < 1e-6 and rel(P[1, 0], torch.eye(3).expand(3, 3, 3)) == 0


@pytest.mark.parametrize("m,chunk", [(2, 0), (3, 32), (4, 20), (8, 16)])
def test_block_gradients(m, chunk, monkeypatch, _bd_tune):
    """Autograd with the variant on: one-pass backward (chunk 0), chunk products from the tiles
    (32 = 2 tiles, 16 = 1) or from an extra summary pass (20); varlen with an empty sequence."""
    calls = block_spy(monkeypatch)
    scanmod.TUNE["chunk"] = chunk
    A, b = block_inputs(1, 77, 3, m, seed=chunk + m)
    run_check(A, b, torch.randn(1, 3, m).to(DEV), None, 1e-5)
    cu = torch.tensor([0, 5, 30, 30, 77], dtype=torch.int64, device=DEV)
    run_check(A, b, torch.randn(4, 3, m).to(DEV), cu, 1e-5)
    assert len(calls) == 2


def test_block_chunk_products(_bd_tune):
    """The backward's chunk products from the tiles (k = 3 tiles per chunk: an odd pairwise
    step, identity padding past the last tile) equal the summary pass's."""
    A, b = block_inputs(1, 90, 3, 4, seed=4)
    cu = torch.tensor([0, 33, 33, 90], dtype=torch.int64, device=DEV)
    out = []
    for chunk in (48, 40):  # 48: from the tiles, 40: summary pass
        _, _, P = lookback_block.block_lookback_forward(
            A, b, None, cu, chunk, scanmod.TUNE, scanmod._empty, scanmod._bd_cfg,
            lambda ch: _summary(A, b, cu, ch))
        out.append(P)
    for P, chunk in zip(out, (48, 40)):
        for s, (x, y) in enumerate(((0, 33), (33, 33), (33, 90))):
            for c, t0 in enumerate(range(x, y, chunk)):
                want = torch.eye(4, dtype=torch.float64).expand(3, 4, 4).clone()
                for t in range(t0, min(t0 + chunk, y)):
                    want = A[0, t].double() @ want
                assert rel(P[s, c], want) < 1e-6, (chunk, s, c)


def _summary(A, b, cu, ch):
    """Reference chunk products through the default chunked forward's summary pass."""
    saved = dict(scanmod.TUNE)
    scanmod.TUNE.clear()
    try:
        _, _, P = scanmod._bd_forward(A, b, None, cu, ch)
    finally:
        scanmod.TUNE.update(saved)
    return P


def test_block_off_by_default_and_m16(monkeypatch):
    """Off by default; with the switch on, m = 16 keeps the default forward."""
    calls = block_spy(monkeypatch)
    scanmod.TUNE.pop("fwd_lookback")
    A, b = block_inputs(1, 20, 2, 2)
    bd.block_diagonal_scan(A, b)
    scanmod.TUNE["fwd_lookback"] = True
    A, b = block_inputs(1, 5, 1, 16)
    e = block_errors(A, b, None, None)
    assert calls == [] and max(e) < 1e-5, e
    with pytest.raises(ValueError, match="power of two"):
        lookback_block.block_lookback_cfg(2, {"lb_bh": 3}, scanmod._bd_cfg)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("m", [2, 4, 8])
@pytest.mark.parametrize("chunk", [32, 64, 128])
def test_gpu_block_many_tiles(m, chunk):
    """Thousands of tiles in flight, repeated: B1 T16384 N768, B8 T2048 N768, varlen."""
    scanmod.TUNE.update(lb_chunk=chunk)
    for B, T, N, cu in ((1, 16384, 768, None), (8, 2048, 768, None),
                        (1, 9000, 256, torch.tensor([0, 1, 4000, 4000, 9000], device=DEV))):
        A, b = block_inputs(B, T, N // m, m, seed=chunk + m)
        h0 = torch.randn(B if cu is None else cu.numel() - 1, N // m, m, device=DEV)
        hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True, cu)
        for _ in range(3):
            h, hf = bd.block_diagonal_scan(A, b, h0, True, cu)
            e = rel(h, hr), rel(hf, hfr)
            assert max(e) < 1e-5, (B, T, N, m, e)
