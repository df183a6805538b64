"""Tests of the m = 1 backward whose tiles are loaded by TMA (``tma_bwd.py``;
``TUNE["diag_tma_bwd"]``), where ``test_kernels_tma.py`` runs (its skip marker: the Triton
interpreter or a GPU with TMA): fp64 step-by-step reference, outputs NaN-poisoned first
(``LRNN_SCAN_POISON=1``), 16 x 8 tiles so that sequence ends, varlen boundaries and the channel
edge fall inside tiles.
"""
import os

os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402
from test_kernels_lookback import inputs, spy  # noqa: E402
import test_kernels_tma  # noqa: E402

from lrnn_scan.kernels.block_diagonal import lookback_bwd, plan, tma_bwd  # noqa: E402

pytestmark = test_kernels_tma.pytestmark  # the same skip: the interpreter or a GPU with TMA
_tune = tune_fixture(dict(diag_tma_bwd=True, tma_bwd_bt=16, tma_bwd_bn=8), dict(bt=8, bn=16))
# (scan.TUNE cleared and set to these around each test: "auto", the default, takes this backward
# only on an H200 and never on CPU tensors, test_rule_and_config)


def launches(monkeypatch):
    """The kernel's launches: ``diag_tma_backward`` calls that ran (it returns None where TMA
    refuses the inputs)."""
    calls = []
    real = tma_bwd.diag_tma_backward

    def wrapped(*args, **kw):
        out = real(*args, **kw)
        calls.append(out is not None)
        return out
    monkeypatch.setattr(tma_bwd, "diag_tma_backward", wrapped)
    return calls


def check(a, b, h0, cu, final=True, tol=1e-5):
    """Output, final state and every gradient (``a``, ``b``, ``h0``) against the fp64 loop, with
    a random cotangent of ``h`` and (``final``) of the final state; the relative errors."""
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    h0 = None if h0 is None else h0.clone().requires_grad_()
    h, hf = bd.diagonal_scan(a, b, h0, final, cu)
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(h.shape, generator=gen).to(DEV)
    gf = torch.randn(h.shape[0] if cu is None else cu.numel() - 1, h.shape[2], generator=gen).to(DEV)
    ins = [x for x in (a, b, h0) if x is not None]
    loss = (h.float() * g).sum() + ((hf * gf).sum() if final else 0)
    grads = torch.autograd.grad(loss, ins)
    ins_d = [x.detach().double().requires_grad_() for x in ins]
    hr, hfr = ref.diagonal_scan_ref(ins_d[0], ins_d[1], ins_d[2] if h0 is not None else None, True, cu)
    rgrads = torch.autograd.grad((hr * g.double()).sum() + ((hfr * gf.double()).sum() if final else 0), ins_d)
    assert all(not torch.isnan(x).any() for x in grads)
    errs = [rel(h, hr)] + [rel(x, y) for x, y in zip(grads, rgrads)]
    assert max(errs) < tol, errs
    return errs


@pytest.mark.parametrize("T,N,h0,final,cfg", [
    (1, 20, True, True, (16, 8, 1, 3, True)), (17, 20, False, True, (16, 8, 1, 3, True)),
    (64, 24, True, False, (16, 8, 2, 2, True)), (129, 20, False, True, (32, 16, 1, 4, False)),
    (300, 36, True, True, (64, 16, 1, 3, True)), (65, 136, False, False, (16, 64, 1, 2, False))])
def test_backward(T, N, h0, final, cfg, monkeypatch):
    """Odd lengths (sequence ends inside tiles), channel counts that end inside a tile, with and
    without ``h0`` and a final-state gradient, 1 or 2 warps, 2-4 stages, the flipped scan and
    Triton's ``reverse=True``."""
    calls = launches(monkeypatch)
    scanmod.TUNE.update(tma_bwd_bt=cfg[0], tma_bwd_bn=cfg[1], tma_bwd_nw=cfg[2], tma_bwd_ns=cfg[3],
                        tma_bwd_flip=cfg[4])
    a, b = inputs(2, T, N, seed=T)
    check(a, b, torch.randn(2, N).to(DEV) if h0 else None, None, final)
    assert calls == [True]


@pytest.mark.parametrize("flip", [True, False])
def test_varlen(flip, monkeypatch):
    """Boundaries inside tiles (a tile runs on into the next sequence, whose rows are identity
    steps), an empty sequence (its ``dh0`` is ``dh_final``), a one-step sequence, the last tile
    past ``T_total``; masked stores (no TMA stores with ``cu_seqlens``)."""
    calls = launches(monkeypatch)
    scanmod.TUNE["tma_bwd_flip"] = flip
    a, b = inputs(1, 129, 20, seed=3)
    cu = torch.tensor([0, 7, 40, 40, 41, 100, 129], dtype=torch.int64, device=DEV)
    for h0 in (torch.randn(6, 20).to(DEV), None):
        check(a, b, h0, cu)
    assert tma_bwd.diag_tma_bwd_config(b, 6, 129, True, scanmod.TUNE, 132).tstore is False
    assert calls == [True, True]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype, monkeypatch):
    """16-bit ``a``, ``b``, ``h`` and gradients (16-byte rows: N = 24), fp32 accumulation,
    gradients rounded once on store. ``da = mu h_{t-1}`` carries the rounding of the stored 16-bit
    ``h`` (bf16 about 6e-3 against fp64 under the interpreter, which truncates), so the bound is
    the tile backward's own error on the same inputs."""
    calls = launches(monkeypatch)
    a, b = inputs(2, 70, 24, dtype=dtype, seed=5)
    h0 = torch.randn(2, 24).to(DEV)
    errs = check(a, b, h0, None, tol=2e-2)
    scanmod.TUNE.update(diag_tma_bwd=False, bwd_lookback=False, fwd_lookback=False)
    base = check(a, b, h0, None, tol=2e-2)
    assert all(e <= 1.05 * e0 + 1e-6 for e, e0 in zip(errs, base)), (errs, base)
    assert calls == [True]


def test_matches_the_lookback_backward(monkeypatch):
    """The same gradients as the look-back backward it replaces (fp32, to rounding)."""
    a, b = inputs(2, 150, 40, seed=8)
    h0 = torch.randn(2, 40).to(DEV)
    out = []
    for mode in (True, False):
        scanmod.TUNE.update(diag_tma_bwd=mode, bwd_lookback=True)
        x, y, z = (t.clone().requires_grad_() for t in (a, b, h0))
        h, hf = bd.diagonal_scan(x, y, z, True)
        out.append(torch.autograd.grad(h.sum() + 2 * hf.sum(), (x, y, z)))
    for u, v in zip(*out):
        assert rel(u, v) < 1e-6


def test_falls_back_where_tma_cannot(monkeypatch):
    """Rows whose byte length is not a multiple of 16 (fp32, N = 21) or tiles narrower than 16
    bytes: ``diag_tma_backward`` returns None and the look-back backward runs, same results."""
    calls = launches(monkeypatch)
    lb = spy(monkeypatch, lookback_bwd, "diag_lookback_backward")
    a, b = inputs(2, 33, 21, seed=9)
    check(a, b, None, None)
    a, b = inputs(2, 33, 24, seed=9)
    assert not tma_bwd.diag_tma_bwd_usable(a, b, b, 2) and tma_bwd.diag_tma_bwd_usable(a, b, b, 4)
    assert not tma_bwd.diag_tma_bwd_usable(a, b, b.bfloat16(), 4)  # 8-byte bf16 tiles of g
    scanmod.TUNE["tma_bwd_bn"] = 2
    check(a, b, None, None)
    assert calls == [False, False] and len(lb) == 2


def test_rule_and_config(monkeypatch):
    """``diag_tma_bwd``: False never; True wherever a backward follows (and then no chunk
    products); "auto" (the default) only on a GPU named in ``_AUTO_BY_DEVICE`` (faked here), in
    its bands of programs an SM at 16 channels, for fixed-length batches of 1024+ steps with rows
    of a multiple of 64 bytes, never on CPU tensors; bad values refused; ``tma_bwd_*`` keys
    override the tiles."""
    b = torch.zeros(8, 2048, 768, device=DEV)
    monkeypatch.setattr(tma_bwd, "device_name", lambda device: "a GPU with no band")  # not the host's
    scanmod.TUNE.clear()
    scanmod.TUNE["diag_tma_bwd"] = False
    assert plan.diag_plan(b, 8, 2048, True)[2] != "tma"
    scanmod.TUNE["diag_tma_bwd"] = True
    chunk, _, bwd = plan.diag_plan(b, 8, 2048, True)
    assert bwd == "tma" and chunk is None
    assert plan.diag_plan(b, 8, 2048, False)[2] is False  # no backward, nothing to plan
    assert plan.backward_plan(b, b, 8, 2048, True, False, True) == (None, "tma")
    scanmod.TUNE["diag_tma_bwd"] = "yes"
    with pytest.raises(ValueError, match="diag_tma_bwd"):
        plan.diag_plan(b, 8, 2048, True)
    cfg = tma_bwd.diag_tma_bwd_config
    assert cfg(b, 8, 2048, False, {"diag_tma_bwd": True}, 132) == (64, 16, 1, 3, True, True)
    assert cfg(b, 8, 2048, True, {"diag_tma_bwd": True}, 132).tstore is False
    wide = torch.zeros(8, 1, 1536, device=DEV)
    assert cfg(wide, 8, 2048, False, {"diag_tma_bwd": True}, 132).bn == 32
    keys = {"diag_tma_bwd": True, "tma_bwd_bt": 32, "tma_bwd_ns": 4, "tma_bwd_flip": False}
    assert cfg(b, 8, 2048, False, keys, 132) == (32, 16, 1, 4, True, False)
    assert cfg(b, 8, 2048, False, {"diag_tma_bwd": False}, 132) is None
    if DEV == "cpu":
        assert cfg(b, 8, 2048, False, {}, 132) is None  # "auto": not on CPU tensors
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(tma_bwd, "device_name", lambda device: "NVIDIA H200")
    # H200 N768 at 16 channels: 48 programs a sequence, 132 SMs; B6 2.18 an SM, B7 2.55, B8 2.91,
    # B11 4.0, B19 6.9, B20 7.27
    for nseq, want in ((6, None), (7, (64, 16, 1, 3)), (8, (64, 16, 1, 3)), (11, (32, 16, 1, 3)),
                       (19, (32, 16, 1, 3)), (20, None)):
        got = cfg(b, nseq, 2048, False, {}, 132)
        assert (got and tuple(got[:4])) == want, nseq
    assert cfg(b, 8, 1023, False, {}, 132) is None  # shorter than _AUTO_MIN_T
    assert cfg(b, 8, 2048, True, {}, 132) is None  # varlen: masked stores lost
    assert cfg(torch.zeros(8, 1, 776, device=DEV), 8, 2048, False, {}, 132) is None  # 32-byte rows
    half = b.bfloat16()
    assert cfg(half, 8, 2048, False, {}, 132) is None and cfg(half, 12, 2048, False, {}, 132)[:4] == (
        64, 16, 1, 3)  # 16-bit: from 4 programs an SM
    assert cfg(b, 8, 2048, False, {"tma_bwd_bt": 128}, 132).bt == 128
    assert cfg(b.double(), 12, 2048, False, {}, 132) is None
    monkeypatch.setattr(tma_bwd, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert cfg(b, 8, 2048, False, {}, 132) is None  # not measured there
