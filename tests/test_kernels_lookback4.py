"""Tests of the ``m = 4`` look-back forward (``lookback4.py``; default for forwards without
gradients below two ring programs per SM, ``TUNE["bd4_lookback"]``) and backward
(``lookback4_bwd.py``; default for one-pass scans with gradients below 1.4 ring programs per SM,
``TUNE["bd4_bwd_lookback"]``).

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

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402
from test_kernels_lookback_dot import make  # noqa: E402  (near-orthogonal blocks: products stay O(1))

from test_kernels_lookback2 import check_forward, grads  # noqa: E402

from lrnn_scan.kernels.block_diagonal import lookback4, lookback4_bwd  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")


_tune = tune_fixture(dict(lb4_chunk=4))


def launch(A, b, h0=None, cu=None):
    return check_forward(lookback4.bd4_lookback_forward, A, b, h0, cu)


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


@pytest.mark.parametrize("incl", [True, False])
@pytest.mark.parametrize("chunk", [4, 8])
def test_varlen(incl, chunk):
    """Varlen with an empty and a one-step sequence, boundaries inside chunks, h0 (an empty
    sequence's final state is its h0)."""
    scanmod.TUNE.update(lb_publish_incl=incl, lb4_chunk=chunk)
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
    """``"auto"``: forwards without gradients and with few ring programs (the interpreter's device
    counts 4 SMs) take the look-back; a forced chunk length or forward kernel, ``bd4_lookback =
    False``, or gradients with ``bd4_bwd_lookback = False`` keep the ring; ``bd4_lookback = True``
    takes it with gradients too (the backward then runs the one-pass ring), against fp64
    autograd; other block sizes never."""
    calls = []
    real = lookback4.bd4_lookback_forward
    monkeypatch.setattr(scanmod, "bd4_lookback_forward", lambda *a: calls.append(1) or real(*a))
    A, b = make(2, 21, 3, 4, seed=1)
    h0 = torch.randn(2, 3, 4).to(DEV)
    with torch.no_grad():
        h, hf = bd.block_diagonal_scan(A, b, h0, True)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True)
    assert calls == [1] and max(rel(h, hr), rel(hf, hfr)) < 1e-5
    for forced in (dict(chunk=8), dict(variant="ring4"), dict(bd4_lookback=False)):
        with scanmod.tuned(forced), torch.no_grad():
            bd.block_diagonal_scan(A, b)
    Ag, bg, h0g = (x.clone().requires_grad_() for x in (A, b, h0))
    scanmod.TUNE.update(bd4_bwd_lookback=False)
    bd.block_diagonal_scan(Ag, bg, h0g, True)
    assert calls == [1]
    scanmod.TUNE.update(bd4_lookback=True)
    h, hf = bd.block_diagonal_scan(Ag, bg, h0g, True)
    (h * torch.cos(h)).sum().add(hf.square().sum()).backward()
    assert calls == [1, 1]
    Ar, br, h0r = (x.double().clone().requires_grad_() for x in (A, b, h0))
    hr, hfr = ref.block_diagonal_scan_ref(Ar, br, h0r, True)
    (hr * torch.cos(hr)).sum().add(hfr.square().sum()).backward()
    assert max(rel(h, hr), rel(hf, hfr)) < 1e-5
    for x, y in ((Ag, Ar), (bg, br), (h0g, h0r)):
        assert rel(x.grad, y.grad) < 1e-5
    A2, b2 = make(2, 9, 3, 2, seed=4)
    with torch.no_grad():
        bd.block_diagonal_scan(A2, b2)
    assert calls == [1, 1]


def test_routing_rule():
    """``bd4_lookback_use(tune, m, grad, chunk, programs, nsm)``: m = 4 without gradients and fewer
    ring programs than twice the SMs, unless a key asks for the ring / chunked passes, or the ring
    would chunk time with fewer programs than a quarter of the SMs (``lb4_min_programs``)."""
    use = lookback4.bd4_lookback_use
    assert use({}, 4, False, None, 263, 132) and not use({}, 4, False, None, 264, 132)
    assert use({}, 4, False, None, 12, 132)                      # one pass: the look-back
    assert not use({}, 4, False, 256, 32, 132) and use({}, 4, False, 256, 33, 132)  # 132 // 4
    assert use({"lb4_min_programs": 12}, 4, False, 256, 12, 132)
    assert not use({"lb4_min_programs": 13}, 4, False, 256, 12, 132)
    assert not use({}, 4, True, None, 12, 132) and not use({}, 2, False, None, 12, 132)
    assert not use({}, 8, False, None, 12, 132)
    for key, val in (("chunk", 256), ("variant", "ring4"), ("bd4_lookback", False)):
        assert not use({key: val}, 4, False, None, 48, 132), key
    assert use({"bd4_lookback": True}, 4, True, 256, 4096, 132)
    assert not use({"bd4_lookback": True}, 2, False, None, 1, 132)
    with pytest.raises(ValueError, match="bd4_lookback"):
        use({"bd4_lookback": "yes"}, 4, False, None, 12, 132)


def test_plan_takes_the_chunked_ring_with_few_programs(monkeypatch):
    """``plan.bd_plan`` at m = 4 without gradients: 24 ring programs on 132 SMs over 16384 steps
    chunk time (H200: 0.188 against 0.221 ms with the look-back; 64-step chunks since the
    thread summaries took m = 4, summary.summary_kind); 48 programs and
    a sequence too short to chunk take the look-back."""
    from lrnn_scan.kernels.block_diagonal import plan
    monkeypatch.setattr(scanmod, "_num_sms", lambda device: 132)
    for (B, T, H), want in (((1, 16384, 192), (64, False)), ((1, 16384, 384), (None, "m4")),
                            ((2, 16384, 192), (None, "m4")), ((1, 2048, 192), (None, "m4"))):
        b = torch.empty(B, T, H, 4)
        A = torch.empty(B, T, H, 4, 4)
        chunk, lookback, _ = plan.bd_plan(A, b, B, T, False)
        assert (chunk, lookback) == want, (B, T, H)


def test_config_and_errors():
    assert lookback4.bd4_lookback_cfg({}) == (8, 32, 1, 1)
    assert lookback4.bd4_lookback_cfg({"lb4_bh": 64, "lb4_chunk": 16}) == (16, 64, 1, 2)
    for key, val in (("lb4_chunk", 12), ("lb4_window", 3), ("lb4_bh", 48), ("lb4_bh", 16)):
        with pytest.raises(ValueError, match=key):
            lookback4.bd4_lookback_cfg({key: val})
    A, b = make(1, 5, 2, 3, seed=0)
    with pytest.raises(ValueError, match="4 x 4"):
        lookback4.bd4_lookback_forward(A, b, None, None, {}, scanmod._empty)


def _bwd(A, h, h0, g, gT, cu):
    out = lookback4_bwd.bd4_lookback_backward(A, h.float(), h0, g.float(), None if gT is None else gT.float(), cu,
                                              scanmod.TUNE, scanmod._empty)
    assert out[2].dtype == torch.float32 and not any(torch.isnan(x).any() for x in out)
    return out


@pytest.mark.parametrize("T", [1, 4, 9, 17])
@pytest.mark.parametrize("window", [1, 2])
def test_backward_lengths_windows(T, window):
    """The backward launcher against fp64 autograd: odd lengths, H = 40 (a partial block group),
    h0 and dh_final on odd T; carries published by the last chunk only (every look-back composes
    maps down to it)."""
    scanmod.TUNE.update(lb4_window=window, lb_publish_incl=False)
    A, b = make(2, T, 40, 4, seed=T + window)
    h0 = torch.randn(2, 40, 4).to(DEV) if T % 2 else None
    h, g, gT, dA, db, dh0 = grads(A, b, h0, None, seed=T, final=bool(T % 2))
    out = _bwd(A, h, h0, g, gT, None)
    e = [rel(out[0], dA), rel(out[1], db)] + ([rel(out[2], dh0)] if h0 is not None else [])
    assert max(e) < 1e-5, e


@pytest.mark.parametrize("incl", [True, False])
def test_backward_varlen(incl):
    """Varlen with an empty and a one-step sequence and boundaries inside chunks: an empty
    sequence's dh0 is its dh_final."""
    scanmod.TUNE.update(lb_publish_incl=incl)
    A, b = make(1, 37, 3, 4, seed=7)
    cu = torch.tensor([0, 5, 20, 20, 21, 37], dtype=torch.int64, device=DEV)
    h0 = torch.randn(5, 3, 4).to(DEV)
    h, g, gT, dA, db, dh0 = grads(A, b, h0, cu, seed=1)
    out = _bwd(A, h, h0, g, gT, cu)
    e = rel(out[0], dA), rel(out[1], db), rel(out[2], dh0)
    assert max(e) < 1e-5 and torch.equal(out[2][2], gT[2].float()), e


def test_backward_routing(monkeypatch):
    """With gradients the forward and the backward are the look-backs by default (a one-pass scan
    with few ring programs: the interpreter's device counts 4 SMs) and with ``TUNE[
    "bd4_bwd_lookback"] = True`` (also where a forced chunk would chunk), through
    ``block_diagonal_scan`` with h0, dh_final and bf16; not with it False nor with a forced chunk,
    forward kernel or ``bd4_lookback = False``."""
    calls = []
    real = lookback4_bwd.bd4_lookback_backward
    monkeypatch.setattr(scanmod, "bd4_lookback_backward", lambda *a: calls.append(1) or real(*a))
    for tune, dtype, want in ((dict(bd4_bwd_lookback=True), torch.float32, 1),
                              (dict(bd4_bwd_lookback=True, chunk=8), torch.float32, 1),
                              (dict(bd4_bwd_lookback=True), torch.bfloat16, 1), (dict(), torch.float32, 1),
                              (dict(bd4_bwd_lookback=False), torch.float32, 0), (dict(chunk=8), torch.float32, 0),
                              (dict(variant="ring4"), torch.float32, 0), (dict(bd4_lookback=False), torch.float32, 0)):
        scanmod.TUNE.clear()
        scanmod.TUNE.update(tune)
        A, b = make(2, 13, 3, 4, dtype, seed=2)
        h0 = torch.randn(2, 3, 4).to(DEV)
        _, g, gT, dA, db, dh0 = grads(A, b, h0, None, seed=3)
        Ag, bg, h0g = (x.clone().requires_grad_() for x in (A, b, h0))
        n = len(calls)
        h, hf = bd.block_diagonal_scan(Ag, bg, h0g, True)
        (h.double() * g).sum().add((hf.double() * gT).sum()).backward()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        e = rel(Ag.grad, dA), rel(bg.grad, db), rel(h0g.grad, dh0)
        assert len(calls) - n == want and max(e) < tol, (tune, e)
    with pytest.raises(ValueError, match="4 x 4"):
        A, b = make(1, 5, 2, 3, seed=0)
        lookback4_bwd.bd4_lookback_backward(A, b, None, b, None, None, {}, scanmod._empty)


def test_backward_rule():
    """``bd4_bwd_lookback_use(tune, m, grad, chunk, programs, nsm)``: m = 4 with gradients, one
    pass and fewer than 1.4 ring programs per SM (``TUNE['bd4_bwd_lb_below']``), unless a key asks
    for the ring / chunked passes."""
    use = lookback4_bwd.bd4_bwd_lookback_use
    assert use({}, 4, True, None, 184, 132) and not use({}, 4, True, None, 185, 132)
    assert use({}, 4, True, None, 176, 132) and not use({}, 4, True, None, 192, 132)  # measured sides
    assert use({"bd4_bwd_lb_below": 1.0}, 4, True, None, 131, 132)
    assert not use({"bd4_bwd_lb_below": 1.0}, 4, True, None, 132, 132)
    assert not use({}, 4, True, 256, 24, 132) and not use({}, 4, False, None, 24, 132)
    assert not use({}, 2, True, None, 24, 132)
    for key, val in (("chunk", 0), ("variant", "ring4"), ("bwd_variant", "v1"), ("bd4_lookback", False)):
        assert not use({key: val}, 4, True, None, 24, 132), key
    assert use({"bd4_bwd_lookback": True}, 4, True, 256, 4096, 132)
    assert not use({"bd4_bwd_lookback": False}, 4, True, None, 24, 132)
    with pytest.raises(ValueError, match="bd4_bwd_lookback"):
        use({"bd4_bwd_lookback": "yes"}, 4, True, None, 24, 132)


def _many_tile_inputs():
    """B8 T2048 N768, B1 T16384 N768 and varlen (an empty and a one-step sequence), with h0."""
    for B, T, H, cu in ((8, 2048, 192, None), (1, 16384, 192, None),
                        (1, 9000, 64, torch.tensor([0, 1, 4000, 4000, 9000], device=DEV))):
        A, b = make(B, T, H, 4, seed=T, pool=4096)
        yield B, T, cu, A, b, torch.randn(B if cu is None else cu.numel() - 1, H, 4, device=DEV)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("cfg", [dict(), dict(lb4_chunk=16), dict(lb4_window=2), dict(lb4_chunk=4, lb4_window=4),
                                 dict(lb4_bh=64), dict(lb_publish_incl=False)])
def test_gpu_many_tiles(cfg):
    """B8 T2048 N768, B1 T16384 N768 and varlen (an empty and a one-step sequence), with h0, three
    times each against the fp64 reference: a race shows as a wrong or run-to-run different h."""
    scanmod.TUNE.clear()
    scanmod.TUNE.update(cfg)
    for B, T, cu, A, b, h0 in _many_tile_inputs():
        for _ in range(3):
            e = launch(A, b, h0, cu)
            assert max(e) < 1e-5, (B, T, cfg, e)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("cfg", [dict(), dict(lb4_window=2), dict(lb_publish_incl=False)])
def test_gpu_many_tiles_backward(cfg):
    """The backward at the same sizes, three times each against fp64 autograd (dA, db, dh0)."""
    scanmod.TUNE.clear()
    scanmod.TUNE.update(cfg)
    for B, T, cu, A, b, h0 in _many_tile_inputs():
        h, g, gT, dA, db, dh0 = grads(A, b, h0, cu, seed=B)
        for _ in range(3):
            out = _bwd(A, h, h0, g, gT, cu)
            e = rel(out[0], dA), rel(out[1], db), rel(out[2], dh0)
            assert max(e) < 1e-5, (B, T, cfg, e)
