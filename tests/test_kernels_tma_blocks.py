"""Tests of the m = 2 and m = 4 forwards whose tiles are loaded by TMA (``tma_blocks.py``;
``TUNE["bd2_tma"]`` / ``["bd4_tma"]``, "auto" by default: GPUs of compute capability 9+ with few
programs).

Triton interpreter (host-side tensor descriptors run there too) or a GPU, fp64 step-by-step
reference, outputs NaN-poisoned before the kernels run (``LRNN_SCAN_POISON=1``). Near-orthogonal
blocks (``make``): tile maps stay O(1), so a wrong carry or composition order reaches every later
output. Small tiles (16 steps, 2-4 blocks) put sequence ends, varlen boundaries and the block edge
inside tiles.
"""
import os

os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402
from test_kernels_lookback import spy  # noqa: E402
from test_kernels_lookback2 import check_forward  # noqa: E402
from test_kernels_lookback_dot import make  # noqa: E402

from lrnn_scan.kernels.block_diagonal import tma_blocks  # noqa: E402

_GPU_TMA = DEV == "cuda" and torch.cuda.get_device_capability()[0] >= 9
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not _GPU_TMA,
                                reason="needs TRITON_INTERPRET=1 or a GPU with TMA (sm_90+)")

_tune = tune_fixture(dict(bd2_tma=True, tma2_bt=16, tma2_bh=4, bd4_tma=True, tma4_bt=16, tma4_bh=2,
                          bd2_tma_bwd=True, bd4_tma_bwd=True, chunk=0))
M = pytest.mark.parametrize("m", [2, 4])


def launches(monkeypatch):
    return spy(monkeypatch, tma_blocks, "bd_tma_forward")


def forward(A, b, h0=None, cu=None):
    return check_forward(tma_blocks.bd_tma_forward, A, b, h0, cu)


def scan_error(A, b):
    return rel(bd.block_diagonal_scan(A, b)[0], ref.block_diagonal_scan_ref(A.double(), b.double())[0])


@M
@pytest.mark.parametrize("T,H,h0,cfg", [(1, 6, True, (16, 4, 1, 3, True, True)),
                                        (17, 10, False, (16, 4, 1, 4, True, False)),
                                        (64, 12, True, (16, 8, 2, 2, False, True)),
                                        (129, 10, False, (32, 8, 1, 3, False, False)),
                                        (300, 18, True, (64, 2, 1, 3, True, True))])
def test_forward(m, T, H, h0, cfg):
    """Odd lengths (sequence ends inside tiles), block counts that end inside a tile, 1 or 2
    warps, 2-4 pipeline stages, ``h`` stored by masked stores or by TMA (``tma<m>_tstore``: the
    last tile clipped at ``T``), the carry as the tile's map or its last ``h`` (``_carry_h``);
    the kernel directly (``check_forward``: no chunk products)."""
    keys = ("bt", "bh", "nw", "ns", "tstore", "carry_h")
    scanmod.TUNE.update({f"tma{m}_{k}": v for k, v in zip(keys, cfg)})
    A, b = make(2, T, H, m, seed=T + m)
    e = forward(A, b, torch.randn(2, H, m).to(DEV) if h0 else None)
    assert max(e) < 1e-5, e


@M
def test_varlen(m):
    """Boundaries inside tiles (a tile runs on into the next sequence), an empty sequence (its
    final state is h0), a one-step sequence, the last tile past ``T_total``; the second pass
    carries the tile's last ``h`` (``tma<m>_carry_h``: the identity steps past ``eos`` keep it)."""
    A, b = make(1, 129, 6, m, seed=3)
    cu = torch.tensor([0, 7, 40, 40, 41, 100, 129], dtype=torch.int64, device=DEV)
    scanmod.TUNE[f"tma{m}_tstore"] = True  # not taken with varlen: masked stores
    for h0 in (torch.randn(6, 6, m).to(DEV), None):
        scanmod.TUNE[f"tma{m}_carry_h"] = h0 is None
        e = forward(A, b, h0, cu)
        assert max(e) < 1e-5, e


@M
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(m, dtype, monkeypatch):
    """16-bit inputs and h through ``block_diagonal_scan`` (rows of 16-byte multiples), fp32
    accumulation and final state: the error is the output rounding."""
    calls = launches(monkeypatch)
    A, b = make(2, 70, 12, m, dtype=dtype, seed=5)
    h0 = torch.randn(2, 12, m).to(DEV)
    h, hf = bd.block_diagonal_scan(A, b, h0, True)
    hr, hfr = ref.block_diagonal_scan_ref(A.double(), b.double(), h0.double(), True)
    assert h.dtype == dtype and hf.dtype == torch.float32
    assert 0 < rel(h, hr) <= 5e-3 and rel(hf, hfr) <= 1e-5, (rel(h, hr), rel(hf, hfr))
    assert len(calls) == 1


def grad_errors(A, b, h0, cu, final=True, tol=1e-5):
    """Forward+backward through ``block_diagonal_scan`` (``h0`` None or ``final`` False: those
    gradients absent), against fp64 autograd: every error below ``tol``, nothing NaN."""
    ins = [x.clone().requires_grad_() for x in (A, b, h0) if x is not None]
    h, hf = bd.block_diagonal_scan(ins[0], ins[1], ins[2] if h0 is not None else None, final, cu)
    g = torch.randn(h.shape, device=DEV)
    gf = torch.randn(hf.shape, device=DEV) if final else None
    loss = (h.float() * g).sum() + ((hf * gf).sum() if final else 0)
    grads = torch.autograd.grad(loss, ins)
    ind = [x.detach().double().requires_grad_() for x in ins]
    hr, hfr = ref.block_diagonal_scan_ref(ind[0], ind[1], ind[2] if h0 is not None else None, True, cu)
    want = torch.autograd.grad((hr * g.double()).sum() + ((hfr * gf.double()).sum() if final else 0), ind)
    errs = [rel(h, hr)] + ([rel(hf, hfr)] if final else []) + [rel(x, y) for x, y in zip(grads, want)]
    assert not any(torch.isnan(x).any() for x in grads)
    assert max(errs) < tol, errs


def bwd_launches(monkeypatch):
    from lrnn_scan.kernels.block_diagonal import tma_blocks_bwd
    return spy(monkeypatch, tma_blocks_bwd, "bd_tma_backward")


@M
@pytest.mark.parametrize("flip", [False, True])
def test_gradients(m, flip, monkeypatch):
    """Autograd with the TMA forward and backward (``tma_blocks_bwd.py``), plain and varlen
    (an empty and a one-step sequence, boundaries inside tiles), every gradient against the fp64
    reference, with and without the time-reversed scan and ``mu`` as the carry
    (``tma<m>_bwd_flip``, ``_carry_mu``); with ``bd<m>_tma_bwd`` False the one-pass backward
    reads the TMA forward's ``h``."""
    calls, bcalls = launches(monkeypatch), bwd_launches(monkeypatch)
    scanmod.TUNE[f"tma{m}_bwd_tstore"] = True  # varlen keeps the masked stores (rows past eos)
    scanmod.TUNE.update({f"tma{m}_bwd_flip": flip, f"tma{m}_bwd_carry_mu": flip})
    for B, cu, nseq in ((2, None, 2), (1, torch.tensor([0, 5, 30, 30, 31, 77], device=DEV), 5)):
        A, b = make(B, 77, 6, m, seed=7)
        grad_errors(A, b, torch.randn(nseq, 6, m).to(DEV), cu)
    assert len(calls) == 2 and len(bcalls) == 2
    scanmod.TUNE[f"bd{m}_tma_bwd"] = False
    grad_errors(*make(2, 40, 6, m, seed=8), torch.randn(2, 6, m).to(DEV), None)
    assert len(calls) == 3 and len(bcalls) == 2
    scanmod.TUNE[f"bd{m}_tma_bwd"] = "yes"
    with pytest.raises(ValueError, match=f"bd{m}_tma_bwd"):
        grad_errors(*make(2, 40, 6, m, seed=8), None, None)


@M
@pytest.mark.parametrize("T,cfg,h0,final,tstore,flip,carry_mu", [(1, (16, 3), True, True, False, False, True),
                                                                 (16, (16, 2), False, True, True, True, False),
                                                                 (17, (32, 4), True, False, True, True, True),
                                                                 (100, (8, 3, 1), False, False, False, False, False)])
def test_backward(m, T, cfg, h0, final, tstore, flip, carry_mu, monkeypatch):
    """The TMA backward at odd lengths (one step; a sequence ending on or inside a tile), with
    and without ``h0`` and the final state's gradient, its own tile length and stages
    (``tma<m>_bwd_bt``, ``_ns``; a third entry sets ``_bh``, other than the forward's, to the
    fewest blocks whose fp32 rows fill TMA's 16 bytes), blocks past ``H`` inside the tile,
    ``dA`` / ``db`` stored by masked stores or by TMA (``tma<m>_bwd_tstore``: the tile past ``T``
    clipped), the reversed scan and the carry each on and off (``_flip``, ``_carry_mu``)."""
    bcalls = bwd_launches(monkeypatch)
    scanmod.TUNE.update({f"tma{m}_bwd_bt": cfg[0], f"tma{m}_bwd_ns": cfg[1], f"tma{m}_bwd_tstore": tstore,
                         f"tma{m}_bwd_flip": flip, f"tma{m}_bwd_carry_mu": carry_mu})
    if len(cfg) > 2:
        scanmod.TUNE[f"tma{m}_bwd_bh"] = 4 // m  # 16-byte rows of fp32 h: 2 blocks at m = 2, 1 at m = 4
    H = 6 if m == 2 else 5  # 16-byte rows of b; the last tile of blocks half past H
    A, b = make(2, T, H, m, seed=T + m)
    grad_errors(A, b, torch.randn(2, H, m).to(DEV) if h0 else None, None, final)
    assert len(bcalls) == 1


@M
def test_backward_low_precision(m, monkeypatch):
    """bf16 ``A``, ``b`` and ``h`` (so bf16 ``dh``), fp32 state: errors of 16-bit rounding."""
    bcalls = bwd_launches(monkeypatch)
    A, b = make(1, 50, 8, m, dtype=torch.bfloat16, seed=4)
    cu = torch.tensor([0, 20, 50], device=DEV)
    grad_errors(A, b, torch.randn(2, 8, m).to(DEV), cu, tol=2e-2)
    assert len(bcalls) == 1


def test_falls_back_where_tma_cannot(monkeypatch):
    """Rows whose byte length is not a multiple of 16 (bf16 b, m = 2, H = 6), tiles narrower than
    16 bytes or mixed dtypes: ``bd_tma_config`` refuses and the default forward runs, with the
    same results; the kernel's own entry raises; m = 3 has no TMA kernel."""
    calls = launches(monkeypatch)
    A, b = make(2, 33, 6, 2, dtype=torch.bfloat16, seed=9)
    assert tma_blocks.bd_tma_config(A, b, 2, scanmod.TUNE, 132) is None
    assert scan_error(A, b) < 5e-3
    A, b = make(2, 33, 8, 2, seed=9)
    assert tma_blocks.bd_tma_config(A, b, 2, dict(bd2_tma=True, tma2_bh=1), 132) is None
    assert tma_blocks.bd_tma_config(A, b, 2, dict(bd2_tma=True, tma2_bh=2), 132) is not None
    assert tma_blocks.bd_tma_config(A.double(), b, 2, dict(bd2_tma=True), 132) is None
    scanmod.TUNE["tma2_bh"] = 1
    assert scan_error(A, b) < 1e-5
    A3, b3 = make(2, 33, 8, 3, seed=9)
    assert tma_blocks.bd_tma_config(A3, b3, 2, dict(bd3_tma=True), 132) is None
    assert scan_error(A3, b3) < 1e-5
    assert calls == []
    with pytest.raises(ValueError, match="refused"):
        tma_blocks.bd_tma_forward(A, b, None, None, scanmod.TUNE, scanmod._empty)


@pytest.mark.parametrize("m", [1, 2, 4])
def test_empty_time_axis_falls_back(m, monkeypatch):
    """T = 0 with TMA forced (m = 1 through ``tma.py``): no descriptor of size 0 is built; the
    other kernels return an empty ``h``, ``h_final = h0`` and ``dh0 = dh_final``."""
    calls = launches(monkeypatch)
    scanmod.TUNE.update(diag_tma=True)
    A, b = make(2, 0, 8, m, seed=1)
    h0 = torch.randn(2, 8, m).to(DEV).requires_grad_()
    if m == 1:
        h, hf = bd.diagonal_scan(A[..., 0, 0], b[..., 0], h0[..., 0], True)
        hf = hf[..., None]
    else:
        h, hf = bd.block_diagonal_scan(A, b, h0, True)
    assert h.shape[1] == 0 and torch.equal(hf, h0.detach())
    gf = torch.randn_like(hf)
    (dh0,) = torch.autograd.grad((hf * gf).sum(), h0)
    assert torch.equal(dh0, gf) and calls == []


@M
def test_misaligned_gradient_falls_back(m, monkeypatch):
    """An incoming ``dL/dh`` 4 bytes off 16-byte alignment (a view into a larger buffer): TMA
    cannot read it, so the backward after the TMA forward is the one-pass kernel, not an error;
    every gradient still matches fp64."""
    calls, bcalls = launches(monkeypatch), bwd_launches(monkeypatch)
    A, b = make(2, 40, 6, m, seed=9)
    ins = [x.clone().requires_grad_() for x in (A, b)]
    h, _ = bd.block_diagonal_scan(*ins)
    g = torch.randn(h.numel() + 1, device=DEV)[1:].view(h.shape)
    assert g.data_ptr() % 16 != 0
    grads = torch.autograd.grad(h, ins, g)
    ind = [x.detach().double().requires_grad_() for x in (A, b)]
    want = torch.autograd.grad(ref.block_diagonal_scan_ref(*ind)[0], ind, g.double())
    assert max(rel(x, y) for x, y in zip(grads, want)) < 1e-5
    assert len(calls) == 1 and bcalls == []


@M
def test_rule_and_config(m, monkeypatch):
    """"auto" (the default) never runs on CPU tensors; True / False force; bad values refused;
    the GPU rule counts default-size programs per SM."""
    calls = launches(monkeypatch)
    A, b = make(2, 40, 8, m, seed=1)
    for mode, used in (("auto", False), (False, False), (True, True)):
        scanmod.TUNE[f"bd{m}_tma"] = mode
        calls.clear()
        assert scan_error(A, b) < 1e-5
        assert (len(calls) > 0) == used, mode
    scanmod.TUNE[f"bd{m}_tma"] = "yes"
    with pytest.raises(ValueError, match=f"bd{m}_tma"):
        bd.block_diagonal_scan(A, b)
    want = (32, 8 if m == 2 else 4, 1, 3)  # outside the bands (2 sequences, H = 8): the last band's
    assert tma_blocks.bd_tma_config(A, b, 2, {f"bd{m}_tma": True}, 132) == want
    assert tma_blocks.bd_tma_config(A, b, 2, {f"bd{m}_tma": True, f"tma{m}_bt": 16, f"tma{m}_ns": 4},
                                    132) == (16, want[1], 1, 4)
    from lrnn_scan.kernels.block_diagonal.tma_blocks_bwd import bd_tma_bwd_config, bd_tma_bwd_use
    # the TMA backward: "auto" only at m = 4; True / False force
    assert bd_tma_bwd_use({}, m) == (m == 4)
    assert bd_tma_bwd_use({f"bd{m}_tma_bwd": True}, m) and not bd_tma_bwd_use({f"bd{m}_tma_bwd": False}, m)
    # its tiles: the forward's at m = 2; at m = 4 two blocks, 32 steps below P = 2.4, 16 from there
    # (B6 / B7 T2048 N768 on 132 SMs: P = 2.2 / 2.5); TMA stores without varlen; the reversed
    # tile and mu as the carry; keys override
    fwd = (64, 4, 1, 3)
    for nseq, bt in ((6, 32), (7, 16)):
        want = fwd + (True, True, True) if m == 2 else (bt, 2, 1, 3, True, True, True)
        assert bd_tma_bwd_config(m, 192, nseq, fwd, {}, 132, False) == want
        assert bd_tma_bwd_config(m, 192, nseq, fwd, {}, 132, True)[4] is False
    # on an H200 the line is P = 3.1 (B8 / B9: P = 2.9 / 3.3)
    for nseq, bt in ((8, 32), (9, 16)):
        want = fwd + (True, True, True) if m == 2 else (bt, 2, 1, 3, True, True, True)
        assert bd_tma_bwd_config(m, 192, nseq, fwd, {}, 132, False, "NVIDIA H200") == want
    assert bd_tma_bwd_config(m, 192, 8, fwd, {}, 132, False, "NVIDIA H100 80GB HBM3")[0] == (64 if m == 2 else 16)
    over = {f"tma{m}_bwd_bt": 8, f"tma{m}_bwd_bh": 1, f"tma{m}_bwd_nw": 2, f"tma{m}_bwd_ns": 5,
            f"tma{m}_bwd_tstore": False, f"tma{m}_bwd_flip": False, f"tma{m}_bwd_carry_mu": False}
    assert bd_tma_bwd_config(m, 192, 8, fwd, over, 132, False) == (8, 1, 2, 5, False, False, False)
    # "auto" on a GPU of 132 SMs at N = 768: (BT, BH) by 4-block programs per SM
    H = 768 // m
    bands = ({4: None, 6: None, 8: (64, 4), 9: None, 10: (32, 8), 16: (32, 8), 20: None, 32: None}
             if m == 2 else {2: None, 3: None, 4: (32, 2), 5: (32, 2), 6: (32, 4), 11: (32, 4), 16: None})
    for nseq, cfg in bands.items():
        assert tma_blocks.bd_tma_auto(m, H, nseq, 132) == cfg, (m, nseq)
        x, y = make(nseq, 1, H, m)
        auto = tma_blocks.bd_tma_config(x, y, nseq, {}, 132)  # CPU tensors: "auto" stays off
        assert auto == (None if cfg is None or DEV == "cpu" else cfg + (1, 3)), (m, nseq, auto)
        if cfg is not None:
            assert tma_blocks.bd_tma_config(x, y, nseq, {f"bd{m}_tma": True}, 132)[:2] == cfg


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU_TMA, reason="GPU sizes")
@M
def test_auto_on_the_gpu_at_few_programs(m, monkeypatch):
    """On a GPU the default sends B8 T2048 N768 (fp32 and bf16) through TMA, with the kernel's
    outputs checked against fp64, and leaves B8 T2048 N4096 (many programs) to the other
    forwards."""
    scanmod.TUNE.clear()
    calls = launches(monkeypatch)
    H = 768 // m
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-3)):
        A, b = make(8, 2048, H, m, dtype=dtype, seed=11, pool=4096)
        assert max(forward(A, b, torch.randn(8, H, m, device=DEV))) < tol
        calls.clear()
        assert scan_error(A, b) < tol
        assert len(calls) == 1
    calls.clear()
    A, b = make(8, 2048, 4096 // m, m, seed=13, pool=4096)
    assert scan_error(A, b) < 1e-5
    assert calls == []
