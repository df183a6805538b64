"""Tests of the m = 1 forward whose tiles are loaded by TMA (``tma.py``; ``TUNE["diag_tma"]``,
"auto" by default: GPUs of compute capability 9+ with few programs).

Triton interpreter (host-side tensor descriptors run there too) or a GPU, fp64 step-by-step
reference, every output NaN-poisoned before the kernels run (``LRNN_SCAN_POISON=1``). Small tiles
(16 steps, 8 channels) put sequence ends, varlen boundaries and the channel edge inside tiles.
"""
import os

os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_block_diagonal import DEV, bd, ref, rel, scanmod, tune_fixture  # noqa: E402
from test_kernels_lookback import fwd_errors as errors, grad_check, inputs, spy  # noqa: E402

from lrnn_scan.kernels.block_diagonal import tma  # noqa: E402

_GPU_TMA = DEV == "cuda" and torch.cuda.get_device_capability()[0] >= 9
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not _GPU_TMA,
                                reason="needs TRITON_INTERPRET=1 or a GPU with TMA (sm_90+)")

_tune = tune_fixture(dict(diag_tma=True, tma_bt=16, tma_bn=8, chunk=0), dict(bt=8, bn=16))


def launches(monkeypatch):
    return spy(monkeypatch, tma, "diag_tma_forward")


@pytest.mark.parametrize("T,N,h0,cfg", [(1, 20, True, (16, 8, 1, 4)), (17, 20, False, (16, 8, 1, 4)),
                                        (64, 24, True, (16, 8, 2, 2)), (129, 20, False, (32, 16, 1, 3)),
                                        (300, 36, True, (64, 16, 1, 4)), (65, 136, False, (16, 64, 1, 4))])
def test_forward(T, N, h0, cfg, monkeypatch):
    """Odd lengths (sequence ends inside tiles), channel counts that end inside a tile, 1 or 2
    warps, 2-4 pipeline stages."""
    calls = launches(monkeypatch)
    scanmod.TUNE.update(tma_bt=cfg[0], tma_bn=cfg[1], tma_nw=cfg[2], tma_ns=cfg[3])
    a, b = inputs(2, T, N, seed=T)
    e = errors(a, b, torch.randn(2, N).to(DEV) if h0 else None, None)
    assert max(e) < 1e-5, e
    assert len(calls) == 1


def test_varlen(monkeypatch):
    """Boundaries inside tiles (a tile runs on into the next sequence), an empty sequence (its
    final state is h0), a one-step sequence, the last tile past ``T_total``."""
    calls = launches(monkeypatch)
    a, b = inputs(1, 129, 20, seed=3)
    cu = torch.tensor([0, 7, 40, 40, 41, 100, 129], dtype=torch.int64, device=DEV)
    for h0 in (torch.randn(6, 20).to(DEV), None):
        e = errors(a, b, h0, cu)
        assert max(e) < 1e-5, e
    assert len(calls) == 2


@pytest.mark.parametrize("dtype,N,cfg", [(torch.bfloat16, 24, None), (torch.float16, 24, None),
                                         (torch.bfloat16, 136, (16, 128, 1, 4)),
                                         (torch.bfloat16, 136, (32, 64, 1, 4)),
                                         (torch.bfloat16, 136, (32, 64, 1, 3))])
def test_low_precision(dtype, N, cfg, monkeypatch):
    """16-bit inputs and h (16-byte rows: N = 24), fp32 accumulation and final state; and the
    16-bit many-program rows' 16 x 128 and 32 x 64 one-warp tiles over 136 channels (the last
    tile mostly past the row's end)."""
    calls = launches(monkeypatch)
    if cfg is not None:
        scanmod.TUNE.update(tma_bt=cfg[0], tma_bn=cfg[1], tma_nw=cfg[2], tma_ns=cfg[3])
    a, b = inputs(2, 70, N, dtype=dtype, seed=5)
    eh, ef = errors(a, b, torch.randn(2, N).to(DEV), None)
    assert 0 < eh <= 5e-3 and ef <= 1e-5, (eh, ef)
    assert len(calls) == 1


def test_gradients(monkeypatch):
    """Autograd with the TMA forward (the backward reads its ``h``), plain and varlen."""
    calls = launches(monkeypatch)
    a, b = inputs(1, 77, 20, seed=7)
    grad_check(a, b, torch.randn(1, 20).to(DEV), None)
    cu = torch.tensor([0, 5, 30, 30, 77], dtype=torch.int64, device=DEV)
    grad_check(a, b, torch.randn(4, 20).to(DEV), cu)
    assert len(calls) == 2


def test_falls_back_where_tma_cannot(monkeypatch):
    """Rows whose byte length is not a multiple of 16 (fp32, N = 21), tiles narrower than 16
    bytes or mixed dtypes: the tile kernel runs, with the same results."""
    calls = launches(monkeypatch)
    a, b = inputs(2, 33, 21, seed=9)
    assert not tma.tma_usable(a, b, 8)
    assert max(errors(a, b, None, None)) < 1e-5
    a, b = inputs(2, 33, 24, seed=9)
    assert not tma.tma_usable(a, b, 2) and tma.tma_usable(a, b, 4)
    assert not tma.tma_usable(a.to(torch.bfloat16), b, 8)
    assert tma.tma_tensors_ok(a, b) and not tma.tma_tensors_ok(a, b[:, :0].contiguous())  # empty
    scanmod.TUNE["tma_bn"] = 2
    assert max(errors(a, b, None, None)) < 1e-5
    assert calls == []


def test_rule_and_config(monkeypatch):
    """"auto" (the default) never runs on CPU tensors nor on a GPU below one program per SM;
    True / False force; bad values refused; the launch configuration follows the programs per SM
    (4 stages are not used on an H100)."""
    calls = launches(monkeypatch)
    a, b = inputs(2, 40, 24)
    for mode, used in (("auto", False), (False, False), (True, True)):  # auto: CPU, or 2 programs
        scanmod.TUNE["diag_tma"] = mode
        calls.clear()
        assert max(errors(a, b, None, None)) < 1e-5
        assert (len(calls) > 0) == used, mode
    scanmod.TUNE["diag_tma"] = "yes"
    with pytest.raises(ValueError, match="diag_tma"):
        bd.diagonal_scan(a, b)
    for k in ("tma_bt", "tma_bn", "tma_nw", "tma_ns"):
        scanmod.TUNE.pop(k, None)
    a, b = inputs(16, 2, 4096)
    # 16 channels up to 4 programs an SM, else 32; 4 stages at 16 channels up to 3 an SM, else 3
    four = 3 if DEV == "cuda" and "H100" in torch.cuda.get_device_name() else 4
    # N4096: many programs (4 an SM at BN = 32) but T = 2, under _MANY_MIN_T, so the one-warp tiles
    # on every GPU (the H200's many-program row from T = 2048: test_many_programs_row)
    assert b.shape[1] < tma._MANY_MIN_T
    for N, nseq, want in ((768, 8, (64, 16, 1, four)), (512, 16, (64, 16, 1, 3)),
                          (1536, 8, (64, 32, 1, 3)), (4096, 8, (64, 32, 1, 3))):
        x, y = a[:nseq, :, :N], b[:nseq, :, :N]
        assert tma.tma_config(x.contiguous(), y.contiguous(), nseq, {"diag_tma": True}, 132) == want
    assert tma.tma_config(a, b, 16, {"diag_tma": True, "tma_bt": 32, "tma_nw": 2}, 132)[::2] == (32, 2)
    assert tma.tma_config(a, b, 16, {"diag_tma": False}, 132) is None
    # "auto" on a GPU: programs at BN = 32 under 4 an SM and at BN = 16 at least 1 an SM
    for N, nseq, want in ((768, 8, True), (768, 2, False), (768, 1, False), (512, 16, True),
                          (1536, 8, True), (4096, 8, False), (768, 22, False), (768, 21, True)):
        assert tma.tma_auto(N, nseq, 132) == want, (N, nseq)


def test_many_programs_row(monkeypatch):
    """On a GPU named in ``_MANY_BY_DEVICE`` (the name faked here) a call with ``T >= _MANY_MIN_T``
    takes the first band that holds its programs an SM (``nseq * cdiv(N, 64) / SMs``), by element
    size: fp32 16 x 64 on one warp at [2, 2.55) (4 stages) and [3.3, 4) (3), 64 x 64 on two
    from 4; 16-bit 16 x 128 on one warp from 4.2, 32 x 64 on one at [3.45, 4.2) (3 stages) and
    [2.9, 3.45) (4), 64 x 32 from 1.9. Other counts, shorter sequences, 8-byte elements or
    another GPU keep the one-warp few-program tiles; ``tma_*`` keys still override; "auto" never runs TMA on CPU tensors."""
    monkeypatch.setattr(tma, "device_name", lambda device: "NVIDIA H200")
    a, b = inputs(2, tma._MANY_MIN_T, 1024)  # 2 x 16 programs at BN = 64
    few, mid16, mid16_3 = (64, 32, 1, 3), (32, 64, 1, 4), (32, 64, 1, 3)
    assert tma.tma_config(a, b, 2, {"diag_tma": True}, 8) == (64, 64, 2, 3)  # 4 an SM
    assert tma.tma_config(a, b, 2, {"diag_tma": True, "tma_nw": 4, "tma_bn": 32}, 8) == (64, 32, 4, 3)
    assert tma.tma_config(a.bfloat16(), b.bfloat16(), 2, {"diag_tma": True}, 8) == mid16_3
    assert tma.tma_config(a, b, 2, {"diag_tma": True}, 9) == (16, 64, 1, 3)  # 3.6 programs an SM
    assert tma.tma_config(a, b, 2, {"diag_tma": True}, 11) == few  # 2.9 programs an SM
    assert tma.tma_config(a, b, 2, {"diag_tma": True}, 14) == (16, 64, 1, 4)  # 2.29 an SM
    # H200 B N4096 (132 SMs, 64 programs a row at BN 64): B4 1.94 an SM, B5 2.42, B6 2.91, B7 3.39,
    # B8 3.88, B9 4.36
    one_warp, three, two_warps = (16, 64, 1, 4), (16, 64, 1, 3), (64, 64, 2, 3)
    for nseq, row in ((4, None), (5, one_warp), (6, None), (7, three), (8, three), (9, two_warps)):
        assert tma._many_cfg(b, 4096, nseq, 132) == row, nseq
    # the bands' edges: B9 / B11 N2048 2.18 / 2.67, B19 / B23 N1024 2.30 / 2.79, B13 / B15 N2048
    # 3.15 / 3.64, B32 / B33 N1024 3.88 / 4.0
    for N, nseq, row in ((2048, 9, one_warp), (2048, 11, None), (1024, 19, one_warp), (1024, 23, None),
                         (2048, 13, None), (2048, 15, three), (1024, 32, three), (1024, 33, two_warps)):
        assert tma._many_cfg(b, N, nseq, 132) == row, (N, nseq)
    wide = (16, 128, 1, 4)
    for dtype in (torch.bfloat16, torch.float16):
        for nseq, row in ((3, None), (4, few), (5, few), (6, mid16), (7, mid16), (8, mid16_3), (9, wide),
                          (24, wide)):
            assert tma._many_cfg(b.to(dtype), 4096, nseq, 132) == row, (dtype, nseq)
        # edges: B23 / B24 N1024 2.79 / 2.91, B28 / B29 N1024 3.39 / 3.52, B17 N2048 4.12; the length
        # past _MANY_MIN_T does not matter
        for N, nseq, row in ((1024, 23, few), (1024, 24, mid16), (1024, 28, mid16), (1024, 29, mid16_3),
                             (2048, 17, mid16_3)):
            assert tma._many_cfg(b.to(dtype), N, nseq, 132) == row, (dtype, N, nseq)
        long = torch.zeros(1, 16384, 8, dtype=dtype)  # only its length and dtype are read
        assert tma._many_cfg(long, 4096, 8, 132) == mid16_3
    assert tma._many_cfg(b.double(), 4096, 8, 132) is None
    short = (a[:, :-1].contiguous(), b[:, :-1].contiguous())
    assert tma.tma_config(*short, 2, {"diag_tma": True}, 8) == few
    assert tma._many_cfg(short[1], 4096, 5, 132) is None
    if DEV == "cpu":
        assert tma.tma_config(a, b, 2, {}, 8) is None  # "auto": not on CPU tensors
    monkeypatch.setattr(tma, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert tma.tma_config(a, b, 2, {"diag_tma": True}, 8) == few
    assert tma._many_cfg(b, 4096, 5, 132) is None


def test_auto_needs_64_byte_rows(monkeypatch):
    """"auto" takes TMA (few programs, or the many-program row) only where a row is a multiple
    of 64 bytes (N4104 and N776 fp32 lost to the tile kernel on an H200); ``many=False`` (the
    scan's 16-step band) drops the row, while ``diag_tma=True`` still forces the few-program
    tiles."""
    monkeypatch.setattr(tma, "device_name", lambda device: "NVIDIA H200")
    for N, nseq, want in ((784, 8, True), (776, 8, False), (1544, 4, False), (1536, 4, True)):
        b = torch.zeros(nseq, 2, N, device=DEV)
        assert tma._auto_takes(b, nseq, 132, False) == want, N      # tma_auto's few programs
        assert tma._auto_takes(b.bfloat16(), nseq, 132, False) == (N % 32 == 0), N
    b = torch.zeros(1, 2, 4104, device=DEV)
    assert not tma._auto_takes(b, 8, 132, True) and tma._auto_takes(b[..., :4096], 8, 132, True)
    a, b = inputs(2, tma._MANY_MIN_T, 1024)
    assert tma.tma_config(a, b, 2, {"diag_tma": True}, 8) == (64, 64, 2, 3)
    assert tma.tma_config(a, b, 2, {"diag_tma": True}, 8, many=False) == (64, 32, 1, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU_TMA, reason="GPU sizes")
def test_auto_on_the_gpu_at_few_programs(monkeypatch):
    """On a GPU the default sends B8 T2048 N768 (fp32 and bf16) through TMA, with gradients too,
    and leaves B8 T2048 N4096 (many programs) to the tile kernel, except on a GPU with a band of
    ``tma._MANY_BY_DEVICE`` for it (an H200), where TMA runs with that band's tiles; B5 is in the
    fp32 one-warp band there."""
    scanmod.TUNE.clear()
    calls = launches(monkeypatch)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-3)):
        a, b = inputs(8, 2048, 768, dtype=dtype, seed=11)
        assert max(errors(a, b, torch.randn(8, 768, device=DEV), None)) < tol
    assert len(calls) == 2
    grad_check(*inputs(8, 2048, 768, seed=12), None, None)
    assert len(calls) == 3
    a, b = inputs(8, 2048, 4096, seed=13)
    assert max(errors(a, b, None, None)) < 1e-5
    sms = scanmod._num_sms(b.device)
    many = tma._many_cfg(b, 4096, 8, sms) is not None
    many16 = tma._many_cfg(b.bfloat16(), 4096, 8, sms) is not None
    assert len(calls) == 3 + many
    assert max(errors(a.bfloat16(), b.bfloat16(), None, None)) < 5e-3
    assert len(calls) == 3 + many + many16
    if many:  # with gradients too
        grad_check(*inputs(8, 2048, 4096, seed=14), None, None)
        assert len(calls) == 4 + many + many16
    n = len(calls)
    a, b = inputs(5, 2048, 4096, seed=15)  # 2.4 programs an SM on an H200: one-warp 16 x 64 tiles
    band = tma._many_cfg(b, 4096, 5, sms) is not None
    grad_check(a, b, None, None)
    assert max(errors(a, b, None, None)) < 1e-5
    assert len(calls) == n + 2 * band
    a, b = inputs(9, 2048, 4096, dtype=torch.bfloat16, seed=16)  # 4.4 an SM: 16 x 128 in bf16
    wide = tma._many_cfg(b, 4096, 9, sms) == (16, 128, 1, 4)
    assert max(errors(a, b, None, None)) < 5e-3
    assert len(calls) == n + 2 * band + wide


@pytest.mark.parametrize("tma_bwd", [False, True])
def test_through_torch_compile(tma_bwd, monkeypatch):
    """``lrnn_scan.compile.diagonal_scan`` (the ``torch.library`` op) runs the TMA forward inside
    its op, eager and under ``torch.compile(fullgraph=True)``, and (``tma_bwd``) the TMA backward
    (``tma_bwd.py``) inside its backward op; gradients against the fp64 loop."""
    import lrnn_scan.compile as lc
    from lrnn_scan.kernels.block_diagonal import tma_bwd as tb
    calls = launches(monkeypatch)
    bwd_calls = spy(monkeypatch, tb, "diag_tma_backward")
    scanmod.TUNE["diag_tma_bwd"] = tma_bwd
    a, b = inputs(1, 45, 24, seed=21)
    cu = torch.tensor([0, 13, 13, 45], dtype=torch.int64, device=DEV)
    h0 = torch.randn(3, 24).to(DEV)
    ad = a.double().requires_grad_()
    hr, hfr = ref.diagonal_scan_ref(ad, b.double(), h0.double(), True, cu)
    (dref,) = torch.autograd.grad(hr.sum(), ad)
    f = torch.compile(lambda *x: lc.diagonal_scan(*x, h0, True, cu), fullgraph=True, backend="aot_eager")
    for fn in (lambda *x: lc.diagonal_scan(*x, h0, True, cu), f):
        x = a.clone().requires_grad_()
        h, hf = fn(x, b)
        assert rel(h, hr) < 1e-5 and rel(hf, hfr) < 1e-5
        (dx,) = torch.autograd.grad(h.sum(), x)
        assert rel(dx, dref) < 1e-5
    assert len(calls) == 2 and len(bwd_calls) == 2 * tma_bwd


def test_band_keeps_the_16bit_row(monkeypatch):
    """In the m = 1 forward's band (``scan._DIAG_BANDS``, faked here) the scan asks tma.py without
    its many-program row (``many=False``: there the band's tiles beat it in fp32); 16-bit inputs
    keep it (H200 bf16 B9 / B12 T2048 N4096, L2 flushed: TMA 0.774x / 0.819x accelerated-scan's
    speed against the band's tiles' 0.522x / 0.642x, thirty-eighth session)."""
    seen = []
    real = tma.tma_config
    monkeypatch.setattr(scanmod, "_diag_band", lambda N, nseq, device, bwd=False: (16, 64, 2))
    monkeypatch.setattr(tma, "tma_config", lambda a, b, nseq, tune, sms, many=True:
                        (seen.append((b.dtype, many)), real(a, b, nseq, tune, sms, many))[1])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, b = inputs(1, 5, 40, dtype=dtype)
        bd.diagonal_scan(a, b)
    assert seen == [(torch.float32, False), (torch.bfloat16, True), (torch.float16, True)]
