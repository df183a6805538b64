"""Tests of the ``m = 2`` look-back forward (``lookback2.py``; default where an ``m = 2`` forward
would time-chunk without gradients or run one pass with few programs) and backward
(``lookback2_bwd.py``; default with gradients where there are fewer (sequence, 32-block group)
pairs than 1.5 times the SMs, ``TUNE["bd2_bwd_lookback"]``).

Triton interpreter, fp64 step-by-step reference, outputs and published values NaN-poisoned
(``LRNN_SCAN_POISON=1``). The interpreter runs programs one at a time in grid order, so no program
spins; ``lb_publish_incl=False`` makes every look-back compose aggregates down to chunk 0. The GPU
test (many tiles in flight, repeated) is where races would show.
"""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402
from test_kernels_lookback_dot import make  # noqa: E402  (near-orthogonal blocks: products stay O(1))

from lrnn_scan.kernels.block_diagonal import lookback2, lookback2_bwd  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")


_tune = tune_fixture(dict(lb2_chunk=8))


def check_forward(forward, A, b, h0=None, cu=None):
    """A look-back forward (``lookback2``'s or ``lookback4``'s contract) against the fp64 reference:
    ``(rel. error of h, of h_final)``; no chunk products, nothing left NaN."""
    h, hf, p = forward(A, b, h0, cu, scanmod.TUNE, scanmod._empty)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None if h0 is None else h0.double(), True, cu)
    assert p is None and not torch.isnan(h).any() and not torch.isnan(hf).any()
    return rel(h, hr), rel(hf, hfr)


def launch(A, b, h0=None, cu=None):
    return check_forward(lookback2.bd2_lookback_forward, A, b, h0, cu)


@pytest.mark.parametrize("T", [1, 8, 17, 64, 65])
@pytest.mark.parametrize("window", [1, 2, 4])
def test_lengths_windows(T, window):
    """Odd lengths (one step, one chunk, chunk boundaries +-1), two sequences, H = 40 (the second
    block group is mostly past H), h0 on odd T; every look-back composes down to chunk 0."""
    scanmod.TUNE.update(lb2_window=window, lb_publish_incl=False)
    A, b = make(2, T, 40, 2, seed=T + window)
    h0 = torch.randn(2, 40, 2).to(DEV) if T % 2 else None
    e = launch(A, b, h0)
    assert max(e) < 1e-5, e


@pytest.mark.parametrize("incl", [True, False])
@pytest.mark.parametrize("chunk", [8, 16, 32])
def test_varlen(incl, chunk):
    """Varlen with an empty and a one-step sequence, boundaries inside chunks, h0 (an empty
    sequence's final state is its h0)."""
    scanmod.TUNE.update(lb_publish_incl=incl, lb2_chunk=chunk)
    A, b = make(1, 61, 3, 2, seed=chunk)
    cu = torch.tensor([0, 5, 30, 30, 31, 61], dtype=torch.int64, device=DEV)
    e = launch(A, b, torch.randn(5, 3, 2).to(DEV), cu)
    assert max(e) < 1e-5, e


def test_status_flags():
    """After a launch every real chunk's flag is 2 (chunk 0 always; beyond it only with
    ``lb_publish_incl``, else 1), chunks past a sequence's end stayed 0, and the counter handed out
    one id per tile."""
    A, b = make(1, 30, 3, 2, seed=5)
    cu = torch.tensor([0, 9, 9, 30], dtype=torch.int64, device=DEV)
    seen = []
    real = lookback2._bd2_lookback_fwd

    class Spy:
        def __getitem__(self, grid):
            def launch_(*args, **kw):
                seen.append(args[5])  # Status
                return real[grid](*args, **kw)
            return launch_

    for incl in (True, False):
        scanmod.TUNE["lb_publish_incl"] = incl
        lookback2._bd2_lookback_fwd = Spy()
        try:
            e = launch(A, b, None, cu)
        finally:
            lookback2._bd2_lookback_fwd = real
        status = seen[-1].cpu()
        nc = 3  # ceil(21 / 8)
        assert status[-1].item() == 3 * nc and max(e) < 1e-5
        for s, nreal in enumerate((2, 1, 3)):  # chunk 0 of the empty sequence publishes h0
            want = [2 if incl or c == 0 else 1 for c in range(nreal)] + [0] * (nc - nreal)
            assert status[s * nc:(s + 1) * nc].tolist() == want, (s, status)


def test_low_precision():
    A, b = make(2, 40, 3, 2, torch.bfloat16, seed=3)
    h, hf, _ = lookback2.bd2_lookback_forward(A, b, None, None, scanmod.TUNE, scanmod._empty)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), None, True)
    assert h.dtype == torch.bfloat16 and 0 < rel(h, hr) <= 5e-3 and rel(hf, hfr) <= 1e-5


def _spy(monkeypatch):
    calls = []
    real = lookback2.bd2_lookback_forward
    monkeypatch.setattr(scanmod, "bd2_lookback_forward", lambda *a: calls.append(1) or real(*a))
    return calls


def test_routing_auto(monkeypatch):
    """``"auto"``: few programs (on the CPU fewer than 4 (sequence, block group) pairs) take
    the look-back with or without gradients (the backward is the one-pass one); where the forward
    chunks only without gradients; a forced chunk length or forward kernel keeps those; other
    block sizes never. Every route against the fp64 reference, gradients included."""
    calls = _spy(monkeypatch)
    scanmod.TUNE.clear()
    A, b = make(2, 20, 3, 2, seed=1)
    h0 = torch.randn(2, 3, 2).to(DEV)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True)
    with torch.no_grad():
        h, hf = bd.block_diagonal_scan(A, b, h0, True)
    assert calls == [1] and max(rel(h, hr), rel(hf, hfr)) < 1e-5
    Ag, bg, h0g = (x.clone().requires_grad_() for x in (A, b, h0))
    h, hf = bd.block_diagonal_scan(Ag, bg, h0g, True)
    (h * torch.cos(h)).sum().add(hf.square().sum()).backward()
    assert calls == [1, 1]
    Ar, br, h0r = (x.double().clone().requires_grad_() for x in (A, b, h0))
    hr, hfr = ref.block_diagonal_scan_ref(Ar, br, h0r, True)
    (hr * torch.cos(hr)).sum().add(hfr.square().sum()).backward()
    for x, y in ((Ag, Ar), (bg, br), (h0g, h0r)):
        assert rel(x.grad, y.grad) < 1e-5
    for forced in (dict(chunk=8), dict(chunk=0), dict(variant="ring4"), dict(bd2_lookback=False)):
        with scanmod.tuned(forced), torch.no_grad():
            bd.block_diagonal_scan(A, b)
    assert calls == [1, 1]
    with scanmod.tuned(dict(bd2_lookback=True, chunk=8)), torch.no_grad():
        e = rel(bd.block_diagonal_scan(A, b)[0], ref.block_diagonal_scan_ref(A.double(), b.double())[0])
    assert calls == [1, 1, 1] and e < 1e-5
    A4, b4 = make(2, 20, 3, 4, seed=4)
    with torch.no_grad():
        bd.block_diagonal_scan(A4, b4)
    assert calls == [1, 1, 1]


def test_routing_rule():
    use = lookback2.bd2_lookback_use
    assert use({}, None, True, False) and use({}, None, True, True) and use({}, 256, False, False)
    assert not use({}, None, False, False) and not use({}, 256, False, True)
    assert not use({}, 256, True, True)  # the chunked backward needs the chunk products
    assert use({"bd2_lookback": True}, None, False, True) and not use({"bd2_lookback": False}, 256, True, False)
    with pytest.raises(ValueError, match="bd2_lookback"):
        use({"bd2_lookback": "yes"}, None, True, False)


def test_config_and_errors():
    assert lookback2.bd2_lookback_cfg({}, 96) == lookback2.bd2_lookback_cfg({}, 16) == (16, 32, 4, 1)
    assert lookback2.bd2_lookback_cfg({}, 12) == (32, 32, 2, 1)
    assert lookback2.bd2_lookback_cfg({"lb2_bh": 64}, 12)[1:] == (64, 2, 2)
    for key, val in (("lb2_chunk", 12), ("lb2_window", 3), ("lb2_bh", 48), ("lb2_bh", 16)):
        with pytest.raises(ValueError, match=key):
            lookback2.bd2_lookback_cfg({key: val}, 12)
    A, b = make(1, 5, 2, 3, seed=0)
    with pytest.raises(ValueError, match="2 x 2"):
        lookback2.bd2_lookback_forward(A, b, None, None, {}, scanmod._empty)


def grads(A, b, h0, cu, seed=0, final=True):
    """fp64 reference gradients of ``<h, g> (+ <h_final, gT>)`` for random cotangents ``g``, ``gT``
    (``gT`` None without ``final``): ``(h, g, gT, dA, db, dh0)``."""
    Ar, br = A.double().requires_grad_(), b.double().requires_grad_()
    h0r = None if h0 is None else h0.double().requires_grad_()
    hr, hfr = ref.block_diagonal_scan_ref(Ar, br, h0r, True, cu)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    g = torch.randn(hr.shape, generator=gen, device=DEV, dtype=torch.float64)
    gT = torch.randn(hfr.shape, generator=gen, device=DEV, dtype=torch.float64) if final else None
    loss = (hr * g).sum()
    (loss + (hfr * gT).sum() if final else loss).backward()
    return hr.detach(), g, gT, Ar.grad, br.grad, None if h0 is None else h0r.grad


@pytest.mark.parametrize("T", [1, 8, 17, 64])
@pytest.mark.parametrize("window", [1, 4])
def test_backward_lengths_windows(T, window):
    """The backward launcher against fp64 autograd: odd lengths, H = 40 (a partial block group),
    h0 and dh_final on odd T; carries published by the last chunk only (every look-back composes
    maps down to it)."""
    scanmod.TUNE.update(lb2_window=window, lb_publish_incl=False)
    A, b = make(2, T, 40, 2, seed=T + window)
    h0 = torch.randn(2, 40, 2).to(DEV) if T % 2 else None
    h, g, gT, dA, db, dh0 = grads(A, b, h0, None, seed=T, final=bool(T % 2))
    out = lookback2_bwd.bd2_lookback_backward(A, h.float(), h0, g.float(), None if gT is None else gT.float(),
                                              None, scanmod.TUNE, scanmod._empty)
    assert out[2].dtype == torch.float32 and not any(torch.isnan(x).any() for x in out)
    e = [rel(out[0], dA), rel(out[1], db)] + ([rel(out[2], dh0)] if h0 is not None else [])
    assert max(e) < 1e-5, e


@pytest.mark.parametrize("incl", [True, False])
def test_backward_varlen(incl):
    """Varlen with an empty and a one-step sequence and boundaries inside chunks: an empty
    sequence's dh0 is its dh_final."""
    scanmod.TUNE.update(lb_publish_incl=incl)
    A, b = make(1, 61, 3, 2, seed=7)
    cu = torch.tensor([0, 5, 30, 30, 31, 61], dtype=torch.int64, device=DEV)
    h0 = torch.randn(5, 3, 2).to(DEV)
    h, g, gT, dA, db, dh0 = grads(A, b, h0, cu, seed=1)
    out = lookback2_bwd.bd2_lookback_backward(A, h.float(), h0, g.float(), gT.float(), cu,
                                              scanmod.TUNE, scanmod._empty)
    e = rel(out[0], dA), rel(out[1], db), rel(out[2], dh0)
    assert max(e) < 1e-5 and torch.equal(out[2][2], gT[2].float()), e


def test_backward_routing():
    """With gradients the forward and the backward are the look-backs by default (few pairs: the
    interpreter's device counts 4 SMs) and with ``TUNE["bd2_bwd_lookback"] = True`` (also where
    a forced chunk would chunk), through ``block_diagonal_scan`` with h0, dh_final and bf16; not
    with it False nor with a forced chunk, forward kernel or ``bd2_lookback = False``."""
    calls = []
    real = lookback2_bwd.bd2_lookback_backward
    scanmod.bd2_lookback_backward = lambda *a: calls.append(1) or real(*a)
    try:
        for tune, dtype, want in ((dict(bd2_bwd_lookback=True), torch.float32, 1),
                                  (dict(bd2_bwd_lookback=True, chunk=8), torch.float32, 1),
                                  (dict(bd2_bwd_lookback=True), torch.bfloat16, 1), (dict(), torch.float32, 1),
                                  (dict(bd2_bwd_lookback=False), torch.float32, 0), (dict(chunk=8), torch.float32, 0),
                                  (dict(bd2_lookback=False), torch.float32, 0)):
            scanmod.TUNE.clear()
            scanmod.TUNE.update(tune)
            A, b = make(2, 37, 3, 2, dtype, seed=2)
            h0 = torch.randn(2, 3, 2).to(DEV)
            _, g, gT, dA, db, dh0 = grads(A, b, h0, None, seed=3)
            Ag, bg, h0g = (x.clone().requires_grad_() for x in (A, b, h0))
            n = len(calls)
            h, hf = bd.block_diagonal_scan(Ag, bg, h0g, True)
            (h.double() * g).sum().add((hf.double() * gT).sum()).backward()
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            e = rel(Ag.grad, dA), rel(bg.grad, db), rel(h0g.grad, dh0)
            assert len(calls) - n == want and max(e) < tol, (tune, e)
    finally:
        scanmod.bd2_lookback_backward = real
    with pytest.raises(ValueError, match="2 x 2"):
        A, b = make(1, 5, 2, 3, seed=0)
        lookback2_bwd.bd2_lookback_backward(A, b, None, b, None, None, {}, scanmod._empty)


def test_backward_rule():
    """``bd2_bwd_lookback_use(tune, m, grad, pairs, nsm)``: m = 2 with gradients and fewer pairs
    than 1.5 times the SMs, unless a key asks for the other passes; True / False override."""
    use = lookback2_bwd.bd2_bwd_lookback_use
    assert use({}, 2, True, 197, 132) and not use({}, 2, True, 198, 132)
    assert not use({}, 2, False, 12, 132) and not use({}, 3, True, 12, 132)
    for key, val in (("chunk", 256), ("variant", "ring4"), ("bwd_variant", "ring"), ("bd2_lookback", False)):
        assert not use({key: val}, 2, True, 12, 132), key
    assert use({"bd2_bwd_lookback": True, "chunk": 256}, 2, True, 4096, 132)
    assert not use({"bd2_bwd_lookback": False}, 2, True, 12, 132) and not use({"bd2_bwd_lookback": True}, 4, True, 1, 132)
    with pytest.raises(ValueError, match="bd2_bwd_lookback"):
        use({"bd2_bwd_lookback": "yes"}, 2, True, 12, 132)


def _many_tile_inputs():
    """B8 T2048 N768, B1 T16384 N768 and varlen (an empty and a one-step sequence), with h0."""
    for B, T, H, cu in ((8, 2048, 384, None), (1, 16384, 384, None),
                        (1, 9000, 128, torch.tensor([0, 1, 4000, 4000, 9000], device=DEV))):
        A, b = make(B, T, H, 2, seed=T, pool=4096)
        yield B, T, cu, A, b, torch.randn(B if cu is None else cu.numel() - 1, H, 2, device=DEV)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("cfg", [dict(), dict(lb2_chunk=32), dict(lb2_window=1), dict(lb2_bh=64, lb2_window=4),
                                 dict(lb_publish_incl=False)])
def test_gpu_many_tiles(cfg):
    """Thousands of tiles in flight, repeated 3 times: B8 T2048 N768, B1 T16384 N768 and varlen,
    against the fp64 loop every time."""
    scanmod.TUNE.clear()
    scanmod.TUNE.update(cfg)
    for B, T, cu, A, b, h0 in _many_tile_inputs():
        hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True, cu)
        for _ in range(3):
            h, hf, _ = lookback2.bd2_lookback_forward(A, b, h0, cu, scanmod.TUNE, scanmod._empty)
            e = rel(h, hr), rel(hf, hfr)
            assert max(e) < 1e-5 and not torch.isnan(h).any(), (B, T, cfg, e)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("cfg", [dict(), dict(lb2_window=1), dict(lb_publish_incl=False)])
def test_gpu_many_tiles_backward(cfg):
    """The backward with thousands of tiles in flight, repeated 3 times: B8 T2048 N768, B1 T16384
    N768 and varlen, against fp64 autograd every time."""
    scanmod.TUNE.clear()
    scanmod.TUNE.update(cfg)
    for B, T, cu, A, b, h0 in _many_tile_inputs():
        h, g, gT, dA, db, dh0 = grads(A, b, h0, cu, seed=T)
        for _ in range(3):
            out = lookback2_bwd.bd2_lookback_backward(A, h.float(), h0, g.float(), gT.float(), cu,
                                                      scanmod.TUNE, scanmod._empty)
            e = rel(out[0], dA), rel(out[1], db), rel(out[2], dh0)
            assert max(e) < 1e-5, (B, T, cfg, e)
