"""Tests of the single-pass look-back forward for m = 1 (``lookback.py``; ``TUNE["fwd_lookback"]``,
"auto" by default: forwards without gradients that the default would time-chunk).

Triton interpreter, fp64 step-by-step reference, every output NaN-poisoned before the kernels run
(``LRNN_SCAN_POISON=1``; the look-back's published values are poisoned too, so reading one before
its flag would show). Small look-back chunks (8-32 steps) make many chunks and windows of 1-4
chunks make the look-back take several steps. The interpreter runs programs one at a time in
grid order, so no program ever spins; ``lb_publish_incl=False`` makes every look-back walk over
aggregates down to chunk 0 instead.
"""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA: setting it here would
# turn every kernel imported after this module's collection into an interpreted one on a GPU machine.
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402

from lrnn_scan.kernels.block_diagonal import lookback  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")


# small tiles for the backward kernels too under the interpreter (its speed)
_tune = tune_fixture(dict(fwd_lookback=True, lb_chunk=16, lb_bn=16, lb_window=4), dict(bt=8, bn=16))


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


def spy(monkeypatch, module=lookback, name="launch_diag_lookback"):
    """Counts calls of ``module.name`` (default: the look-back forward's launch; proves the
    variant ran)."""
    calls = []
    real = getattr(module, name)

    def wrapped(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(module, name, wrapped)
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


def test_auto_rule(monkeypatch):
    """``"auto"`` (the default): the look-back runs exactly where the default rule would time-chunk a
    forward (with or without gradients); False never, True always; bad values refused."""
    calls = spy(monkeypatch)
    scanmod.TUNE.pop("fwd_lookback")
    a, b = inputs(1, 40, 20)
    chunked = {}

    def choose(nprog, max_len, device, align, m=1, grad=False):  # "chunk" = the default rule's answer
        return chunked["c"]
    monkeypatch.setattr(scanmod, "_choose_chunk", choose)
    for want_chunk, grad, mode, used in ((None, False, None, False), (16, False, None, True),
                                         (16, True, None, True), (16, False, False, False),
                                         (None, False, True, True), (None, True, True, True)):
        chunked["c"] = want_chunk
        if mode is None:
            scanmod.TUNE.pop("fwd_lookback", None)
        else:
            scanmod.TUNE["fwd_lookback"] = mode
        calls.clear()
        x = a.clone().requires_grad_(grad)
        h, _ = bd.diagonal_scan(x, b)
        hr, _ = ref.diagonal_scan_ref(a.double(), b.double(), None, False, None)
        assert (len(calls) > 0) == used, (want_chunk, grad, mode)
        assert rel(h, hr) < 1e-5
    scanmod.TUNE["fwd_lookback"] = "yes"
    with pytest.raises(ValueError, match="fwd_lookback"):
        bd.diagonal_scan(a, b)
    with pytest.raises(ValueError, match="power of two"):
        lookback.lookback_cfg({"lb_chunk": 24})
    with pytest.raises(ValueError, match="lb_nw"):
        lookback.lookback_cfg({"lb_nw": 3})
    # default warps: 4 up to 128 x 32 tiles, 8 from 256 x 32 on (4 spill there)
    assert [lookback.lookback_cfg({"lb_chunk": c})[3] for c in (16, 64, 128, 256, 512)] == [4, 4, 4, 8, 8]
    # the backward's own window, if set
    tune = {"lb_window": 2, "lb_bwd_window": 16}
    assert lookback.lookback_cfg(tune)[2] == 2 and lookback.lookback_cfg(tune, True)[2] == 16
    assert lookback.lookback_cfg({"lb_window": 2}, True)[2] == 2
    with pytest.raises(ValueError, match="lb_bwd_window"):
        lookback.lookback_cfg({"lb_bwd_window": 3}, True)


# ----------------------------------------------------------------------------- backward (lookback_bwd.py)
from lrnn_scan.kernels.block_diagonal import lookback_bwd  # noqa: E402


def bwd_spy(monkeypatch):
    return spy(monkeypatch, lookback_bwd, "diag_lookback_backward")


@pytest.mark.parametrize("T,window,h0,fwd", [(1, 4, True, True), (17, 1, False, False),
                                             (64, 2, True, True), (129, 4, False, True),
                                             (300, 16, True, False), (300, -8, False, True)])
def test_backward(T, window, h0, fwd, monkeypatch):
    """``bwd_lookback``: gradients of a, b, h0 against fp64 autograd (one chunk, partial last
    chunks, many chunks with windows of 1-16; -8: ``lb_bwd_window`` 8 with the forward's 2), with
    either forward."""
    calls = bwd_spy(monkeypatch)
    seen, real = [], lookback_bwd.lookback_cfg
    monkeypatch.setattr(lookback_bwd, "lookback_cfg",
                        lambda tune, bwd=False: (seen.append(real(tune, bwd)[2]), real(tune, bwd))[1])
    win = dict(lb_window=window) if window > 0 else dict(lb_window=2, lb_bwd_window=-window)
    scanmod.TUNE.update(bwd_lookback=True, fwd_lookback=fwd, **win)
    a, b = inputs(2, T, 20, seed=T)
    grad_check(a, b, torch.randn(2, 20).to(DEV) if h0 else None, None)
    assert len(calls) == 1 and seen == [abs(window)]  # the backward launch's window


def test_backward_varlen(monkeypatch):
    """Boundaries inside chunks, an empty sequence (its dh0 is dh_final), a 1-step sequence."""
    calls = bwd_spy(monkeypatch)
    scanmod.TUNE.update(bwd_lookback=True)
    a, b = inputs(1, 78, 20, seed=3)
    cu = torch.tensor([0, 5, 30, 30, 77, 78], dtype=torch.int64, device=DEV)
    grad_check(a, b, torch.randn(5, 20).to(DEV), cu)
    grad_check(a, b, None, cu)
    assert len(calls) == 2


def test_backward_auto_rule(monkeypatch):
    """``bwd_lookback="auto"`` (the default): the look-back backward runs where the gradient rule
    would time-chunk or the one-pass backward has few programs over long sequences (then the
    forward is chosen as for inference and leaves no chunk products); True always, False never,
    a forced ``TUNE["chunk"]`` keeps the chunked backward; bad values refused. Gradients against
    fp64 every time. The counts below assume 4 SMs (the CPU's): on a GPU the same is patched in."""
    monkeypatch.setattr(scanmod, "_num_sms", lambda device: 4)
    calls = bwd_spy(monkeypatch)
    rules = {}

    def choose(nprog, max_len, device, align, m=1, grad=False):  # the default rule's answer
        return rules["grad" if grad else "fwd"]
    monkeypatch.setattr(scanmod, "_choose_chunk", choose)
    a, b = inputs(1, 40, 20, seed=11)
    for grad_chunk, mode, used in ((None, None, False), (16, None, True), (16, False, False),
                                   (None, True, True), (16, True, True)):
        rules.update(grad=grad_chunk, fwd=None)
        scanmod.TUNE.pop("fwd_lookback", None)
        if mode is None:
            scanmod.TUNE.pop("bwd_lookback", None)
        else:
            scanmod.TUNE["bwd_lookback"] = mode
        calls.clear()
        grad_check(a, b, None, None)
        assert (len(calls) > 0) == used, (grad_chunk, mode)
    scanmod.TUNE.pop("bwd_lookback")
    # "auto" also where the one-pass backward has few programs (here 2 < 2 x 4 "SMs") over
    # sequences of at least chunk_min_len steps, though the gradient rule would not chunk
    rules.update(grad=None)
    for below, min_len, used in ((2, 32, True), (2, 64, False), (0.25, 32, False)):
        scanmod.TUNE.update(bwd_lb_below=below, chunk_min_len=min_len)
        calls.clear()
        grad_check(a, b, None, None)
        assert (len(calls) > 0) == used, (below, min_len)
    # the backward's programs are counted on its own tiles: narrow forward tiles (5 programs, not
    # few at 1 x 4 "SMs") do not hide a one-program backward
    scanmod.TUNE.update(bwd_lb_below=1, chunk_min_len=32, bn=4, bn_bwd=32)
    calls.clear()
    grad_check(a, b, None, None)
    assert calls
    for k in ("bn", "bn_bwd"):
        scanmod.TUNE.pop(k)
    scanmod.TUNE["chunk"] = 16  # a forced chunk keeps the chunked backward
    rules.update(grad=16)
    calls.clear()
    grad_check(a, b, None, None)
    assert not calls
    scanmod.TUNE.pop("chunk")
    scanmod.TUNE["bwd_lookback"] = "yes"
    with pytest.raises(ValueError, match="bwd_lookback"):
        bd.diagonal_scan(a.clone().requires_grad_(), b)


@pytest.mark.parametrize("dht", [True, False])
def test_backward_matches_chunked_backward(dht):
    """The launcher against ``scan._diag_backward``'s own paths, with and without ``dh_final``
    (autograd always passes one), varlen with an empty sequence."""
    a, b = inputs(1, 70, 20, seed=8)
    cu = torch.tensor([0, 33, 33, 70], dtype=torch.int64, device=DEV)
    h0 = torch.randn(3, 20).to(DEV)
    h, _ = bd.diagonal_scan(a, b, h0, False, cu)
    g = torch.randn(h.shape).to(DEV)
    dhT = torch.randn(3, 20).to(DEV) if dht else None
    got = lookback_bwd.diag_lookback_backward(a, h, h0, g, dhT, cu, scanmod.TUNE, scanmod._empty)
    scanmod.TUNE.pop("fwd_lookback")
    want = scanmod._diag_backward(a, h, h0, g, dhT, cu, None, None)
    for x, y in zip(got, want):
        assert not torch.isnan(x).any() and rel(x, y.double()) < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_low_precision(dtype, monkeypatch):
    """16-bit a, b, h, dh: fp32 scan inside, gradients rounded once on store. da = lam h_{t-1}
    carries the rounding of the stored 16-bit h (bf16: ~6e-3 against fp64 for the default
    backward too), so the bound is the default backward's own error on the same inputs."""
    a, b = inputs(2, 70, 20, dtype=dtype, seed=5)
    h0 = torch.randn(2, 20).to(DEV)
    scanmod.TUNE.update(bwd_lookback=False, fwd_lookback=False)
    base = grad_check(a, b, h0, None, tol=2e-2)
    scanmod.TUNE.update(bwd_lookback=True)
    errs = grad_check(a, b, h0, None, tol=2e-2)
    assert all(e <= 1.05 * e0 + 1e-6 for e, e0 in zip(errs, base)), (errs, base)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("chunk,window", [(32, 16), (64, 1), (128, 16), (128, 4)])
def test_gpu_many_tiles_backward(chunk, window):
    """The backward look-back with thousands of tiles in flight, repeated: B1 T16384 N768,
    B8 T2048 N768, varlen; gradients against the fp64 reference every time."""
    scanmod.TUNE.update(bwd_lookback=True, lb_chunk=chunk, lb_bn=32, lb_window=window)
    for B, T, N, cu in ((1, 16384, 768, None), (8, 2048, 768, None),
                        (1, 9000, 256, torch.tensor([0, 1, 4000, 4000, 9000], device=DEV))):
        a, b = inputs(B, T, N, seed=chunk + window)
        h0 = torch.randn(B if cu is None else cu.numel() - 1, N, device=DEV)
        for _ in range(3):
            grad_check(a, b, h0, cu)


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="races only show on a GPU: many tiles running at once")
@pytest.mark.parametrize("chunk,window", [(32, 16), (64, 1), (64, 16), (128, 32), (128, 4)])
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
