"""CPU tests of the block-diagonal / diagonal scan kernels under the Triton interpreter.

Every case checks the output, the final state and the gradients for A, b and h0 against a float64
step-by-step reference (relative RMS error), with kernel outputs NaN-poisoned before each run
(``LRNN_SCAN_POISON=1`` makes the launchers fill their outputs with NaN), and with chunk lengths
forced small so that the chunked path (chunk summaries -> carry scan -> re-run) and varlen
boundaries inside chunks are exercised.
"""
import os

# TRITON_INTERPRET=1 comes from tests/conftest.py, and only without CUDA: setting it here would
# turn every kernel imported after this module's collection into an interpreted one on a GPU machine.
os.environ["LRNN_SCAN_POISON"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

import lrnn_scan.kernels.block_diagonal as bd  # noqa: E402
from lrnn_scan.kernels.block_diagonal import ref  # noqa: E402
from lrnn_scan.kernels.block_diagonal import scan as scanmod  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or CUDA")
DEV = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


@pytest.fixture(autouse=True)
def _reset_tune():
    scanmod.TUNE.clear()
    if DEV == "cpu":  # small tiles keep the interpreter quick; few m = 4 look-back tiles too
        scanmod.TUNE.update(bt=8, bn=16, d=4, lb4_chunk=32)
    yield
    scanmod.TUNE.clear()


def tune_fixture(keys, cpu_keys=None):
    """An autouse fixture for a test module (assign it to a module name): ``scan.TUNE`` cleared
    and set to ``keys``, plus ``cpu_keys`` under the interpreter, around each test, then restored."""
    @pytest.fixture(autouse=True)
    def _tune():
        saved = dict(scanmod.TUNE)
        scanmod.TUNE.clear()
        scanmod.TUNE.update(keys)
        if DEV == "cpu" and cpu_keys:
            scanmod.TUNE.update(cpu_keys)
        yield
        scanmod.TUNE.clear()
        scanmod.TUNE.update(saved)
    return _tune


def rel(x, y):
    x, y = x.double(), y.double()
    return ((x - y).norm() / y.norm().clamp_min(1e-300)).item()


def make(B, T, H, m, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = 1 - torch.rand(B, T, H, m, m, generator=g)   # (0, 1]: no 0 / 0 rows at m = 1
    A = A / A.sum(-1, keepdim=True) * (2 * torch.rand(B, T, H, m, 1, generator=g) - 1)
    b = torch.randn(B, T, H, m, generator=g)
    return A.to(DEV, dtype).contiguous(), b.to(DEV, dtype).contiguous()


def run_check(A, b, h0, cu, tol, fn="block", final=True):
    """Outputs, final state and gradients against fp64; ``final=False``: the loss reads ``h`` only."""
    A = A.detach().clone().requires_grad_()
    b = b.detach().clone().requires_grad_()
    h0 = None if h0 is None else h0.detach().clone().requires_grad_()
    gen = torch.Generator().manual_seed(1)
    if fn == "block":
        h, hf = bd.block_diagonal_scan(A, b, h0, True, cu)
        rfn = ref.block_diagonal_scan_ref
    else:
        h, hf = bd.diagonal_scan(A, b, h0, True, cu)
        rfn = ref.diagonal_scan_ref
    assert h.shape == b.shape and h.dtype == b.dtype and hf.dtype == torch.float32
    assert not torch.isnan(h).any() and not torch.isnan(hf).any()
    g = torch.randn(h.shape, generator=gen).to(DEV)
    gf = torch.randn(hf.shape, generator=gen).to(DEV) * final
    ins = [x for x in (A, b, h0) if x is not None]
    grads = torch.autograd.grad((h.float() * g).sum() + ((hf * gf).sum() if final else 0), ins)
    ins_d = [x.detach().double().requires_grad_() for x in ins]
    Ad, bdd = ins_d[0], ins_d[1]
    h0d = ins_d[2] if h0 is not None else None
    hr, hfr = rfn(Ad, bdd, h0d, True, cu)
    rgrads = torch.autograd.grad((hr * g.double()).sum() + (hfr * gf.double()).sum(), ins_d)
    errs = {"h": rel(h, hr), "h_final": rel(hf, hfr)}
    for name, x, y in zip(("dA", "db", "dh0"), grads, rgrads):
        assert not torch.isnan(x).any(), f"{name} has NaN (unwritten element?)"
        assert x.dtype == ins[("dA", "db", "dh0").index(name)].dtype
        errs[name] = rel(x, y)
    for k, v in errs.items():
        assert v < tol, f"{k}: relative RMS error {v:.2e} >= {tol:.0e} ({errs})"
    return errs


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("T", [1, 17, 64, 129])
def test_block_fwd_bwd(m, T):
    A, b = make(2, T, 2, m, seed=10 * m + T)
    h0 = torch.randn(2, 2, m).to(DEV)
    run_check(A, b, h0 if T % 2 else None, None, 1e-5)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("T", [17, 129])
def test_block_fwd_bwd_ring_m2_m4(T, m):
    """m = 2, 4 through the ring kernels: with the interpreter's few programs the default is the
    look-back pair (lookback2.py / lookback4.py and their _bwd; test_kernels_lookback2/4.py)."""
    scanmod.TUNE.update(bd2_lookback=False, bd2_bwd_lookback=False, bd4_lookback=False, bd4_bwd_lookback=False)
    A, b = make(2, T, 2, m, seed=20 + T + m)
    run_check(A, b, torch.randn(2, 2, m).to(DEV), None, 1e-5)


@pytest.mark.parametrize("m,chunk", [(1, 16), (2, 16), (3, 16), (4, 16), (8, 16), (3, 48)])
def test_block_chunked_varlen(m, chunk):
    """Chunked path with sequence boundaries inside chunks and an empty sequence."""
    scanmod.TUNE["chunk"] = chunk
    T = 129
    A, b = make(1, T, 2, m, seed=m + chunk)
    cu = torch.tensor([0, 7, 40, 40, 100, T], dtype=torch.int64, device=DEV)
    h0 = torch.randn(5, 2, m).to(DEV)
    run_check(A, b, h0, cu, 1e-5)


@pytest.mark.parametrize("m", [1, 3])
def test_block_chunked_batch(m):
    scanmod.TUNE["chunk"] = 32
    A, b = make(2, 70, 2, m, seed=3 + m)
    run_check(A, b, None, None, 1e-5)
    scanmod.TUNE["chunk"] = 0
    run_check(A, b, torch.randn(2, 2, m).to(DEV), None, 1e-5)


def test_block_varlen_unchunked():
    scanmod.TUNE["chunk"] = 0
    A, b = make(1, 64, 3, 4, seed=5)
    cu = torch.tensor([0, 1, 33, 64], dtype=torch.int64, device=DEV)
    run_check(A, b, torch.randn(3, 3, 4).to(DEV), cu, 1e-5)


@pytest.mark.parametrize("T,chunk", [(1, 0), (17, 0), (129, 0), (1, 32), (129, 48)])
def test_diagonal(T, chunk):
    scanmod.TUNE["chunk"] = chunk
    g = torch.Generator().manual_seed(T + chunk)
    a = (2 * torch.rand(2, T, 21, generator=g) - 1).to(DEV)
    b = torch.randn(2, T, 21, generator=g).to(DEV)
    run_check(a, b, torch.randn(2, 21).to(DEV), None, 1e-5, fn="diag")


@pytest.mark.parametrize("fwd_cfg,bwd_cfg", [((8, 16, 2), (16, 8, 1)), ((32, 8, 1), (8, 16, 2))])
def test_diagonal_tile_configs(fwd_cfg, bwd_cfg):
    """Forward and backward m = 1 tiles of different shapes (``bt_bwd``/``bn_bwd``/``nw_bwd``),
    one pass and varlen chunks whose length is not a multiple of either tile length."""
    scanmod.TUNE.update(bt=fwd_cfg[0], bn=fwd_cfg[1], num_warps_diag=fwd_cfg[2],
                        bt_bwd=bwd_cfg[0], bn_bwd=bwd_cfg[1], nw_bwd=bwd_cfg[2], chunk=0)
    g = torch.Generator().manual_seed(21)
    a = (2 * torch.rand(1, 101, 20, generator=g) - 1).to(DEV)
    b = torch.randn(1, 101, 20, generator=g).to(DEV)
    run_check(a, b, torch.randn(1, 20).to(DEV), None, 1e-5, fn="diag")
    scanmod.TUNE["chunk"] = 20
    cu = torch.tensor([0, 7, 40, 40, 101], dtype=torch.int64, device=DEV)
    run_check(a, b, torch.randn(4, 20).to(DEV), cu, 1e-5, fn="diag")


@pytest.mark.parametrize("N", [18, 20, 24, 40, 48])
def test_diagonal_row_divisor(N):
    """Rows of 2, 4, 8 and 16-divisible lengths: the m = 1 kernels (tiles, look-backs) get
    ``NV = row_divisor(N)``, rebuild ``N`` as ``(N // NV) * NV``; a wrong ``NV`` fails here."""
    from lrnn_scan.kernels._host import row_divisor
    assert row_divisor(N) == {18: 2, 20: 4, 24: 8, 40: 8, 48: 16}[N]
    scanmod.TUNE.update(bt=8, bn=32, bt_bwd=8, bn_bwd=32, chunk=0)
    g = torch.Generator().manual_seed(N)
    a = (2 * torch.rand(2, 37, N, generator=g) - 1).to(DEV)
    b = torch.randn(2, 37, N, generator=g).to(DEV)
    run_check(a, b, torch.randn(2, N).to(DEV), None, 1e-5, fn="diag")
    scanmod.TUNE["chunk"] = 16
    cu = torch.tensor([0, 5, 40, 74], dtype=torch.int64, device=DEV)
    run_check(a.view(1, 74, N), b.view(1, 74, N), torch.randn(3, N).to(DEV), cu, 1e-5, fn="diag")
    del scanmod.TUNE["chunk"]  # the look-back kernels (lookback.py, lookback_bwd.py) take NV too
    scanmod.TUNE.update(fwd_lookback=True, bwd_lookback=True, lb_chunk=16, lb_bn=32)
    run_check(a.view(1, 74, N), b.view(1, 74, N), torch.randn(3, N).to(DEV), cu, 1e-5, fn="diag")


def test_diagonal_forward_tile_by_gpu_name(monkeypatch):
    """The m = 1 tiles are picked by GPU name (H100: 16 x 64 forward and backward, measured there;
    H200: 32 x 64 forward and backward; other GPUs 64 x 32); the backward has 4 warps; the
    few-programs tiles (their own for the backward) and TUNE overrides win."""
    from lrnn_scan.kernels import _host as host
    monkeypatch.setattr(scanmod, "_num_sms", lambda device: 132)
    scanmod.TUNE.clear()                       # no interpreter tiles (the autouse fixture's)
    dev = torch.device("cuda", 0)
    many, few = (8, 4096), (1, 768)            # (nseq, N): 1024 and 24 programs at BN = 32
    for name, fwd, bwd in (("NVIDIA H100 80GB HBM3", (16, 64, 2), (16, 64, 4)),
                           ("NVIDIA H200", (32, 64, 2), (32, 64, 4)),
                           ("NVIDIA A100-SXM4-80GB", (64, 32, 2), (64, 32, 4))):
        monkeypatch.setitem(host._NAMES, 0, name)
        assert scanmod._diag_cfg(many[1], many[0], dev)[:3] == fwd, name
        assert scanmod._diag_cfg(many[1], many[0], dev, bwd=True)[:3] == bwd, name
        assert scanmod._diag_cfg(few[1], few[0], dev)[:3] == scanmod._DIAG_FEW, name
        assert scanmod._diag_cfg(few[1], few[0], dev, bwd=True)[:3] == scanmod._DIAG_FEW_BWD, name
    monkeypatch.setitem(host._NAMES, 0, "NVIDIA H200")
    monkeypatch.setitem(scanmod.TUNE, "bt", 16)
    assert scanmod._diag_cfg(many[1], many[0], dev)[:3] == (16, 64, 2)   # TUNE's bt, the H200's bn
    assert scanmod._diag_cfg(4096, 8, torch.device("cpu"))[:2] == (16, 32)


def test_diagonal_wave_tail_bands(monkeypatch):
    """H200: the m = 1 tiles of ``_DIAG_BANDS`` (programs per SM at BN = 64, N4096: B -> 0.485 B)
    where the default would leave a thin last wave: forward 16 x 64 at B9-B14, not B8 / B16;
    backward 16 x 64 (4 warps) at B5-B7, 64 x 32 at B9, 16 x 64 on 2 warps at B13-B15, the default
    at B8, B10-B12, B16 and the few-programs tiles at B4; TUNE's keys win; other GPUs keep theirs."""
    from lrnn_scan.kernels import _host as host
    monkeypatch.setattr(scanmod, "_num_sms", lambda device: 132)
    scanmod.TUNE.clear()
    dev = torch.device("cuda", 0)
    monkeypatch.setitem(host._NAMES, 0, "NVIDIA H200")
    fwd = {B: scanmod._diag_cfg(4096, B, dev)[:3] for B in (5, 8, 9, 13, 14, 16, 20)}
    assert fwd == {5: (32, 64, 2), 8: (32, 64, 2), 9: (16, 64, 2), 13: (16, 64, 2),
                   14: (16, 64, 2), 16: (32, 64, 2), 20: (32, 64, 2)}
    bwd = {B: scanmod._diag_cfg(4096, B, dev, bwd=True)[:3] for B in (4, 5, 7, 8, 9, 10, 12, 13, 15, 16)}
    assert bwd == {4: scanmod._DIAG_FEW_BWD, 5: (16, 64, 4), 7: (16, 64, 4), 8: (32, 64, 4),
                   9: (64, 32, 4), 10: (32, 64, 4), 12: (32, 64, 4), 13: (16, 64, 2),
                   15: (16, 64, 2), 16: (32, 64, 4)}
    assert scanmod._diag_cfg(8192, 5, dev)[0] == 16                  # 4.8 an SM: the same band
    assert scanmod._diag_cfg(4608, 8, dev, bwd=True)[:2] == (64, 32)  # 4.4 an SM
    monkeypatch.setitem(scanmod.TUNE, "bt", 32)
    assert scanmod._diag_cfg(4096, 9, dev)[0] == 32
    monkeypatch.setitem(scanmod.TUNE, "nw_bwd", 8)
    assert scanmod._diag_cfg(4096, 13, dev, bwd=True)[:3] == (32, 64, 8)
    scanmod.TUNE.clear()
    monkeypatch.setitem(host._NAMES, 0, "NVIDIA H100 80GB HBM3")
    assert scanmod._diag_band(4096, 9, dev) is None and scanmod._diag_cfg(4096, 9, dev)[0] == 16
    assert scanmod._diag_cfg(4096, 13, dev, bwd=True)[:3] == (16, 64, 4)
    monkeypatch.setitem(host._NAMES, 0, "NVIDIA A100-SXM4-80GB")
    assert scanmod._diag_cfg(4096, 9, dev)[0] == 64


def test_device_band():
    """``_host.device_band``: the first (lo, hi] band holding the value, by GPU name and key;
    None on the CPU, for an unknown GPU or key, and outside every band."""
    from lrnn_scan.kernels import _host as host
    table = {"H200": {"k": (((1.0, 2.0), "a"), ((2.0, 4.0), "b"))}}
    dev = torch.device("cuda", 7)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(host._NAMES, 7, "NVIDIA H200")
        got = [host.device_band(table, dev, "k", x) for x in (1.0, 1.5, 2.0, 2.5, 4.0, 4.5)]
        assert got == [None, "a", "a", "b", "b", None] and host.device_band(table, dev, "o", 1.5) is None
        mp.setitem(host._NAMES, 7, "NVIDIA H100 80GB HBM3")
        assert host.device_band(table, dev, "k", 1.5) is None
    assert host.device_band(table, torch.device("cpu"), "k", 1.5) is host.device_band(table, None, "k", 1.5) is None
    # the TMA tile tables' bands hold their lower edge instead ([lo, hi))
    bands = table["H200"]["k"]
    got = [host.band_choice(bands, x, right_closed=False) for x in (0.5, 1.0, 1.5, 2.0, 3.9, 4.0)]
    assert got == [None, "a", "a", "b", "b", None] and host.band_choice((), 1.0) is None


def test_diagonal_varlen_chunked():
    scanmod.TUNE.update(chunk=32)
    T = 129
    g = torch.Generator().manual_seed(9)
    a = (2 * torch.rand(1, T, 20, generator=g) - 1).to(DEV)
    b = torch.randn(1, T, 20, generator=g).to(DEV)
    cu = torch.tensor([0, 7, 40, 40, 100, T], dtype=torch.int64, device=DEV)
    run_check(a, b, torch.randn(5, 20).to(DEV), cu, 1e-5, fn="diag")


@pytest.mark.parametrize("fwd,bwd", [("v1", "g4"), ("g4", "g4"), ("v1", "v1"), ("ring1", "g4"),
                                     ("ring2", "v1"), ("ring4", "ring")])
def test_kernel_variants(fwd, bwd):
    """The one-step-loop and hand-pipelined kernels compute the same thing (also chunked)."""
    scanmod.TUNE.update(variant=fwd, bwd_variant=bwd)
    A, b = make(2, 19, 2, 3, seed=4)
    run_check(A, b, torch.randn(2, 2, 3).to(DEV), None, 1e-5)
    scanmod.TUNE["chunk"] = 8
    run_check(A[:1], b[:1], None, torch.tensor([0, 5, 19], device=DEV), 1e-5)


# the two largest cases (30-40 s each under the interpreter since _fast_interpreter.py, 50-75 s
# before) run in the slow pass (CI runs both)
@pytest.mark.parametrize("m,variant", [(1, "ring4"), (2, "ring2"), (3, "ring2"),
                                       pytest.param(8, "ring4", marks=pytest.mark.slow), (2, "ring8"),
                                       pytest.param(5, "ring8", marks=pytest.mark.slow)])
def test_ring_variants(m, variant):
    """The ring forward (the default ring4 runs in every other test; here m = 1 routed through the
    block kernels and ring2), its one-column-per-program chunk summaries (default) and the
    matrix-state summaries, on odd lengths and varlen chunks."""
    scanmod.TUNE.update(variant=variant, diag_variant="ring")
    A, b = make(2, 37, 3, m, seed=7 * m)
    run_check(A, b, torch.randn(2, 3, m).to(DEV), None, 1e-5)
    for summary in ("ring", "v1"):
        scanmod.TUNE.update(chunk=12, summary=summary)
        cu = torch.tensor([0, 5, 30, 30, 61, 74], dtype=torch.int64, device=DEV)
        run_check(A.reshape(1, 74, 3, m, m), b.reshape(1, 74, 3, m), torch.randn(5, 3, m).to(DEV), cu, 1e-5)


@pytest.mark.parametrize("m,bwd", [(1, "ring"), (2, "ring"), (3, "ring"), (4, "ring"),
                                   pytest.param(8, "ring", marks=pytest.mark.slow), (2, "ring4"),
                                   (3, "ring4"), pytest.param(16, "ring2", marks=pytest.mark.slow)])
def test_bwd_ring(m, bwd):
    """The backward ring kernels (8 or 16 slots): one pass with h0 and dh_final, varlen chunks."""
    scanmod.TUNE.update(bwd_variant=bwd, diag_variant="ring")
    A, b = make(2, 37, 3, m, seed=11 * m)
    run_check(A, b, torch.randn(2, 3, m).to(DEV), None, 1e-5)
    scanmod.TUNE["chunk"] = 12
    cu = torch.tensor([0, 5, 30, 30, 61, 74], dtype=torch.int64, device=DEV)
    run_check(A.reshape(1, 74, 3, m, m), b.reshape(1, 74, 3, m), torch.randn(5, 3, m).to(DEV), cu, 1e-5)


def spy_launches(monkeypatch, name, pick):
    """Replace the kernel ``scan.<name>`` by one that appends ``pick(grid, launch keywords)`` to the
    returned list at every launch, then runs the real kernel."""
    seen = []
    real = getattr(scanmod, name)

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(pick(grid, kw))
                return real[grid](*args, **kw)
            return launch
    monkeypatch.setattr(scanmod, name, Spy())
    return seen


def test_bwd_v1_stages(monkeypatch):
    """The one-step backward chosen for few programs runs a 16-stage pipeline (``bwd_ns``); with
    ``_BWD_FEW`` (1024) programs or more, or ``TUNE['num_stages']`` set, it keeps the configured
    stages (the line lowered to 4 here: 1030 programs took a minute under the interpreter)."""
    seen = spy_launches(monkeypatch, "_bd_bwd_kernel", lambda grid, kw: (grid[0] * grid[1] * grid[2], kw["NS"]))
    scanmod.TUNE.update(bd4_bwd_lookback=False)  # else few programs take lookback4_bwd.py
    A, b = make(2, 9, 3, 4, seed=2)
    run_check(A, b, None, None, 1e-5)                        # 2 programs: v1, 16 stages
    assert seen and all(ns == 16 for _, ns in seen), seen
    seen.clear()
    scanmod.TUNE.update(num_stages=5)
    run_check(A, b, None, None, 1e-5)
    assert seen and all(ns == 5 for _, ns in seen), seen
    seen.clear()
    scanmod.TUNE.pop("num_stages")
    monkeypatch.setattr(scanmod, "_bwd_variant", lambda m, nprog, device=None: "v1")
    scanmod.TUNE.update(bh=1)
    monkeypatch.setattr(scanmod, "_BWD_FEW", 4)
    A, b = make(1, 5, 6, 4, seed=3)                          # 6 programs >= 4: configured stages
    run_check(A, b, None, None, 1e-5)
    assert seen and all(ns == scanmod._bd_cfg(4)[3] for _, ns in seen), seen


@pytest.mark.parametrize("sms, want", [(1, 10), (2, 16)])
def test_bwd_v1_stages_m16(monkeypatch, sms, want):
    """m = 9..16 with at least 2.75 programs per SM: 10 stages, else 16 (``_bwd_deep_stages``);
    ``TUNE['bwd_ns']`` overrides. (m = 16 below 4 programs an SM: the kernel by shuffles.)"""
    seen = spy_launches(monkeypatch, "_bd_bwd_gather", lambda grid, kw: kw["NS"])
    monkeypatch.setattr(scanmod, "_num_sms", lambda dev: sms)
    A, b = make(3, 5, 1, 16, seed=4)                         # 3 programs (one 16 x 16 block each)
    run_check(A, b, torch.randn(3, 1, 16).to(DEV), None, 1e-5)
    assert seen == [want], seen
    assert scanmod._bwd_deep_stages(8, 3, 1) == 16           # m = 8 keeps 16
    scanmod.TUNE.update(bwd_ns=7)
    assert scanmod._bwd_deep_stages(16, 3, 1) == 7


def test_bwd_warps(monkeypatch):
    """The backward runs on 1 warp at ``mp = 16`` and 2 at ``mp = 32`` (``_bwd_warps``); the
    forward, and the scan of chunk carries inside the backward, keep ``_bd_cfg``'s 2 / 4.
    ``bwd_num_warps`` sets the backward's alone, ``num_warps`` both."""
    bwd = spy_launches(monkeypatch, "_bd_bwd_kernel", lambda grid, kw: kw["num_warps"])
    ring = spy_launches(monkeypatch, "_bd_bwd_ring", lambda grid, kw: kw["num_warps"])
    fwd = spy_launches(monkeypatch, "_bd_fwd_ring", lambda grid, kw: kw["num_warps"])
    scanmod.TUNE.update(chunk=2)                             # chunked: carries scanned in the bwd
    A, b = make(1, 5, 2, 12, seed=5)                         # m = 12 (mp 16, masked rows): v1
    run_check(A, b, torch.randn(1, 2, 12).to(DEV), None, 1e-5)
    assert bwd and set(bwd) == {1} and fwd and set(fwd) == {2}, (bwd, fwd)
    fwd.clear()
    scanmod.TUNE.pop("chunk")
    A, b = make(1, 3, 1, 24, seed=6)                         # m = 24 (mp 32): ring2
    run_check(A, b, None, None, 1e-5)
    assert ring and set(ring) == {2} and fwd and set(fwd) == {4}, (ring, fwd)
    S = scanmod
    assert [S._bwd_warps(mp, S._bd_cfg(mp)[2]) for mp in (2, 4, 8, 16, 32)] == [1, 1, 1, 1, 2]
    with S.tuned({"bwd_num_warps": 4}):
        assert S._bwd_warps(16, 2) == 4
    with S.tuned({"num_warps": 8}):
        assert S._bwd_warps(16, S._bd_cfg(16)[2]) == 8 == S._bd_cfg(16)[2]


def test_max_seq_len():
    """``_host.max_seq_len``: T without offsets, else the longest sequence; 0 with no sequence."""
    from lrnn_scan.kernels._host import max_seq_len
    assert max_seq_len(7, None) == 7
    assert max_seq_len(74, torch.tensor([0, 5, 30, 30, 61, 74])) == 31
    assert max_seq_len(0, torch.tensor([0])) == 0 and max_seq_len(0, torch.tensor([0, 0])) == 0


def test_chunk_policy(monkeypatch):
    """Forward only: chunk (256 steps; 128 at m = 5..8, the thread summaries, and 64 at m = 4 where
    they fill the GPU) only below one
    program per SM and from T = 4096 on; with gradients only below half a program per SM (one at
    m = 5..16), then 256-step (128) chunks from m = 4 on, below that about 4 programs per SM in
    chunks >= 256."""
    monkeypatch.setattr(scanmod, "_num_sms", lambda device: 132)
    scanmod.TUNE.clear()
    cc = scanmod._choose_chunk
    assert cc(12, 16384, "cpu", 1, 2) == 256            # B=1, N=768, m=2
    assert cc(24, 16384, "cpu", 64, 1) == 256           # m = 1 tiles (aligned to BT = 64)
    assert cc(192, 2048, "cpu", 1, 4) is None           # B=8, N=768, m=4
    assert cc(192, 2048, "cpu", 1, 4, grad=True) is None   # B=8, N=768: one pass (H100 sweep)
    assert cc(96, 2048, "cpu", 1, 2, grad=True) is None
    assert cc(65, 2048, "cpu", 1, 2, grad=True) == 256      # < 66 programs: chunks for ~528 programs
    assert cc(12, 16384, "cpu", 1, 2, grad=True) == 373
    assert cc(48, 16384, "cpu", 1, 16) == 256 and cc(24, 16384, "cpu", 1, 32, grad=True) == 256
    assert cc(48, 16384, "cpu", 1, 16, grad=True) == 256   # m = 16, grad, < 1 program per SM
    # m = 4: thread summaries in 64-step chunks where they make 8 programs an SM, else ring, 256
    assert cc(24, 16384, "cpu", 1, 4, grad=True) == 64 and cc(24, 16384, "cpu", 1, 4) == 64
    assert cc(48, 16384, "cpu", 1, 4, grad=True) == 64 and cc(24, 4096, "cpu", 1, 4, grad=True) == 256
    assert cc(24, 16384, "cpu", 1, 3, grad=True) == 745    # m < 4: aims at ~528 programs
    assert cc(384, 2048, "cpu", 1, 16, grad=True) is None
    assert cc(96, 2048, "cpu", 1, 8, grad=True) == 128     # m = 5..16: below one program per SM
    assert cc(131, 16384, "cpu", 1, 16, grad=True) == 256 and cc(96, 2048, "cpu", 1, 5, grad=True) == 128
    # m = 5..8 take the thread summaries, in 128-step chunks with and without gradients
    assert cc(48, 16384, "cpu", 1, 8) == 128 and cc(64, 16384, "cpu", 1, 6, grad=True) == 128
    scanmod.TUNE["summary"] = "dot"                        # their own chunks with another summary
    assert cc(48, 16384, "cpu", 1, 8) == 256 and cc(64, 16384, "cpu", 1, 6, grad=True) == 256
    assert cc(24, 16384, "cpu", 1, 4) == 256
    scanmod.TUNE.clear()
    assert cc(96, 2048, "cpu", 1, 32, grad=True) is None    # m = 32: below half a program per SM
    assert cc(132, 2048, "cpu", 1, 8, grad=True) is None
    assert cc(96, 2048, "cpu", 1, 4, grad=True) is None     # m <= 4: below half a program per SM
    assert cc(96, 1000, "cpu", 1, 8, grad=True) is None     # shorter than 1024 steps: one pass
    assert cc(12, 1000, "cpu", 1, 2) is None            # short sequences: one pass
    assert cc(96, 2048, "cpu", 1, 2) is None            # forward, T < 4096: one ring8 pass
    scanmod.TUNE["chunk"] = 100
    assert cc(10 ** 6, 16384, "cpu", 1, 2) == 100


def test_m4_thread_summary_rule():
    """m = 4: thread summaries in 64-step chunks where their grid makes 8 programs an SM (the
    H100's measured shapes at N768 / N384, 132 SMs), ring summaries in 256-step chunks otherwise;
    ``summary_kind`` follows the chunk length, ``TUNE['summary']`` overrides both."""
    from lrnn_scan.kernels.block_diagonal.summary import default_chunk, summary_kind
    assert default_chunk(4, {}, 24, 16384, 132) == 64 and default_chunk(4, {}, 24, 65536, 132) == 64
    assert default_chunk(4, {}, 48, 16384, 132) == 64                      # B2 T16384 N768
    assert default_chunk(4, {}, 24, 4096, 132) == 256 and default_chunk(4, {}, 12, 16384, 132) == 256
    assert default_chunk(4, {"summary": "ring"}, 24, 16384, 132) == 256
    assert default_chunk(4, {"summary": "thread"}, 24, 4096, 132) == 128
    assert default_chunk(8, {}, 1, 16384, 132) == 128 and default_chunk(6, {}, 1, 4096, 132) == 128
    assert default_chunk(2, {}, 1, 16384, 132) == 256 and default_chunk(16, {}, 1, 16384, 132) == 256
    assert summary_kind(4, {}, 64) == "thread" and summary_kind(4, {}, 256) == "ring"
    assert summary_kind(4, {"summary": "ring"}, 64) == "ring" and summary_kind(3, {}, 64) == "ring"
    assert summary_kind(8, {}, 512) == "thread" and summary_kind(9, {}, 64) == "dot"
    with pytest.raises(ValueError, match="summary"):
        summary_kind(4, {"summary": "threads"}, 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    A, b = make(2, 33, 3, 4, dtype=dtype, seed=1)
    errs = run_check(A, b, torch.randn(2, 3, 4).to(DEV), None, 2e-2)
    assert errs["h"] > 0  # actually rounded to the low-precision output dtype


def test_no_final_state_and_no_grad_of_final():
    A, b = make(1, 17, 2, 2)
    h, hf = bd.block_diagonal_scan(A, b)
    assert hf is None
    hr, _ = ref.block_diagonal_scan_ref(A.double(), b.double())
    assert rel(h, hr) < 1e-6
    A.requires_grad_(True)
    h, _ = bd.block_diagonal_scan(A, b)
    (dA,) = torch.autograd.grad(h.sum(), (A,))
    assert not torch.isnan(dA).any()


@pytest.mark.parametrize("m,T,chunk", [(1, 65, None), (2, 65, None), (4, 65, None), (8, 65, None),
                                       (1, 101, 16), (3, 101, 16)])
def test_gradients_without_final_state(monkeypatch, m, T, chunk):
    """A loss on ``h`` alone: the backward gets None for the final state's gradient, not a zero
    tensor (no zero fill, no read of it), for one-pass and chunked varlen plans; gradients
    against fp64."""
    seen = []
    real = scanmod._run_backward
    monkeypatch.setattr(scanmod, "_run_backward", lambda *a: seen.append(a[4]) or real(*a))
    if chunk:
        scanmod.TUNE["chunk"] = chunk
    A, b = make(1, T, 3, m, seed=40 + m)
    cu = torch.tensor([0, 7, 40, 40, T], dtype=torch.int64, device=DEV) if chunk else None
    h0 = torch.randn(4 if chunk else 1, 3, m).to(DEV)
    run_check(A, b, h0, cu, 1e-5, final=False)
    assert seen == [None], seen
    seen.clear()
    run_check(A, b, h0, cu, 1e-5)                 # with it: the gradient reaches the kernels
    assert len(seen) == 1 and seen[0] is not None


def test_errors():
    A, b = make(1, 4, 2, 3)
    with pytest.raises(ValueError, match="A must have shape"):
        bd.block_diagonal_scan(A[..., :2, :2].contiguous(), b)
    with pytest.raises(ValueError, match="m"):
        A2, b2 = make(1, 2, 1, 33)
        bd.block_diagonal_scan(A2, b2)
    with pytest.raises(TypeError, match="b must be float32"):
        bd.block_diagonal_scan(A, b.double())
    with pytest.raises(TypeError, match="A must be a torch.Tensor"):
        bd.block_diagonal_scan(None, b)
    with pytest.raises(ValueError, match="contiguous"):
        bd.block_diagonal_scan(A.transpose(3, 4), b)
    with pytest.raises(ValueError, match="b must have shape"):
        bd.block_diagonal_scan(A, b[0])
    with pytest.raises(ValueError, match="initial_state must have shape"):
        bd.block_diagonal_scan(A, b, torch.zeros(2, 2, 3, device=DEV))
    with pytest.raises(ValueError, match="cu_seqlens"):
        bd.block_diagonal_scan(A, b, cu_seqlens=torch.tensor([0, 3], device=DEV))
    with pytest.raises(ValueError, match="cu_seqlens needs batch size 1"):
        A3, b3 = make(2, 4, 2, 3)
        bd.block_diagonal_scan(A3, b3, cu_seqlens=torch.tensor([0, 4], device=DEV))
    with pytest.raises(ValueError, match="a and b must have one shape"):
        bd.diagonal_scan(torch.zeros(1, 3, 4, device=DEV), torch.zeros(1, 3, 5, device=DEV))
    if DEV == "cpu":
        os.environ["TRITON_INTERPRET"] = "0"
        try:
            with pytest.raises(ValueError, match="CUDA"):
                bd.block_diagonal_scan(A, b)
        finally:
            os.environ["TRITON_INTERPRET"] = "1"


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16, 17])
@pytest.mark.parametrize("nt", [1, 2])
def test_summary_dot_products(m, nt):
    """The tensor-core chunk summaries (summary.py) against float64 products and end states:
    varlen chunks cut by sequence ends (an empty sequence, a 1-step one), blocks past H in the last
    tile (H = 3 with 2..16 blocks per program), NaN-poisoned outputs, fp32 and bf16 inputs."""
    from lrnn_scan.kernels.block_diagonal.summary import launch_summary_dot
    cu = torch.tensor([0, 9, 9, 10, 31], dtype=torch.int64, device=DEV)
    chunk, H, nseq = 8, 3, 4
    lens = (cu[1:] - cu[:-1]).tolist()
    nc = -(-max(lens) // chunk)
    for dtype in (torch.float32, torch.bfloat16):
        A, b = make(1, 31, H, m, dtype, seed=m + 50 * nt)
        P = torch.full((nseq, nc, H, m, m), float("nan"), device=DEV)
        E = torch.full((nseq, nc, H, m), float("nan"), device=DEV)
        launch_summary_dot(A, b, P, E, cu, 31, H, chunk, nc, nseq, m, 2, True,
                           {"sum_nt": nt, "sum_prec": "ieee"})
        _check_summaries(A, b, P, E, cu, chunk)


def _check_summaries(A, b, P, E, cu, chunk):
    """``P (nseq, nc, H, m, m)``, ``E (nseq, nc, H, m)`` (NaN-poisoned before the launch) against
    float64 chunk products and zero-start end states of ``A (1, T, H, m, m)``, ``b (1, T, H, m)``."""
    nseq, nc, H, m = E.shape
    Pr = torch.eye(m, dtype=torch.float64).expand(nseq, nc, H, m, m).clone()
    Er = torch.zeros(nseq, nc, H, m, dtype=torch.float64)
    for s in range(nseq):
        for c in range(nc):
            for t in range(cu[s] + c * chunk, min(cu[s + 1], cu[s] + (c + 1) * chunk)):
                At = A[0, t].double().cpu()
                Pr[s, c] = At @ Pr[s, c]
                Er[s, c] = (At @ Er[s, c, ..., None])[..., 0] + b[0, t].double().cpu()
    assert not P.isnan().any() and not E.isnan().any()
    assert rel(P.cpu(), Pr) < 1e-6 and rel(E.cpu(), Er) < 1e-6, (rel(P.cpu(), Pr), rel(E.cpu(), Er))


@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("nw", [1, 2])
def test_summary_thread_products(m, nw):
    """The one-block-per-thread chunk summaries (summary_thread.py) against float64: varlen chunks
    cut by sequence ends (an empty sequence, a 1-step one), lanes past H (H = 35 on 32- and
    64-block programs), 16-byte (m = 4, 8), 8-byte (m = 6's b) and scalar (m = 3) loads,
    NaN-poisoned outputs, fp32 and bf16 inputs, 1- and 2-warp programs."""
    from lrnn_scan.kernels.block_diagonal.summary_thread import launch_summary_thread
    cu = torch.tensor([0, 9, 9, 10, 31], dtype=torch.int64, device=DEV)
    chunk, H, nseq = 8, 35, 4
    nc = 3
    for dtype in (torch.float32, torch.bfloat16):
        A, b = make(1, 31, H, m, dtype, seed=m + 70 * nw)
        P = torch.full((nseq, nc, H, m, m), float("nan"), device=DEV)
        E = torch.full((nseq, nc, H, m), float("nan"), device=DEV)
        launch_summary_thread(A, b, P, E, cu, 31, H, chunk, nc, nseq, m, True,
                              {"sumt_nw": nw})
        _check_summaries(A, b, P, E, cu, chunk)


@pytest.mark.parametrize("m", [4, 5, 8])
def test_summary_thread_end_to_end(m):
    """``TUNE['summary'] = 'thread'`` through the chunked forward and backward (h0, dh_final,
    varlen chunks with boundaries inside them) against float64."""
    scanmod.TUNE.update(summary="thread", chunk=12)
    A, b = make(2, 37, 3, m, seed=17 * m)
    cu = torch.tensor([0, 5, 30, 30, 61, 74], dtype=torch.int64, device=DEV)
    run_check(A.reshape(1, 74, 3, m, m), b.reshape(1, 74, 3, m), torch.randn(5, 3, m).to(DEV), cu, 1e-5)


@pytest.mark.parametrize("m,summary,rerun_len", [(4, "thread", 36), (8, "thread", 48),
                                                   (2, "ring", 1000), (3, "dot", 24)])
def test_rerun_longer_chunks(m, summary, rerun_len, monkeypatch):
    """The chunked forward's re-run over ``k`` summary chunks at a time (``summary.rerun_factor``;
    12-step summary chunks, ``k`` = 3, 4, all, 2): its carries are those of every ``k``-th chunk,
    with sequence ends inside chunks, a chunk count not a multiple of ``k``, h0 and dh_final, against
    float64 (outputs NaN-poisoned first)."""
    from lrnn_scan.kernels.block_diagonal import summary as summ
    monkeypatch.setattr(summ, "RERUN_PER_SM", 0)  # keep k at rerun_len // chunk on tiny grids
    k = summ.rerun_factor(12, 3, 1, 4, {"rerun_len": rerun_len})
    assert k == rerun_len // 12 and summ.rerun_factor(12, 3, 1, 4, {"rerun_len": 0}) == 1
    scanmod.TUNE.update(summary=summary, sum_prec="ieee", chunk=12, rerun_len=rerun_len)
    A, b = make(2, 37, 3, m, seed=19 * m)
    cu = torch.tensor([0, 5, 30, 30, 61, 74], dtype=torch.int64, device=DEV)
    run_check(A.reshape(1, 74, 3, m, m), b.reshape(1, 74, 3, m), torch.randn(5, 3, m).to(DEV), cu, 1e-5)
    run_check(A, b, torch.randn(2, 3, m).to(DEV), None, 1e-5)


def test_rerun_factor_keeps_programs():
    """``rerun_factor`` shortens ``k`` (halving) until the re-run has 8 programs an SM; off (1) by
    default."""
    from lrnn_scan.kernels.block_diagonal.summary import rerun_factor
    on = {"rerun_len": 256}
    assert rerun_factor(64, 256, 24, 132, on) == 4        # m = 4 B1 T16384 N768: 1536 programs
    assert rerun_factor(128, 128, 48, 132, on) == 2       # m = 8: 3072 programs
    assert rerun_factor(128, 8, 48, 132, on) == 1         # B1 T1024: 192 programs at k = 2
    assert rerun_factor(64, 64, 24, 132, on) == 1         # 768 at k = 2 < 1056
    assert rerun_factor(256, 64, 24, 132, on) == 1 and rerun_factor(64, 256, 24, 132, {}) == 1
    for bad in (-1, 25.0, "256", True):
        with pytest.raises(ValueError, match="rerun_len"):
            rerun_factor(64, 256, 24, 132, {"rerun_len": bad})


def test_summary_thread_bad_args():
    """Block sizes past 8 and warp counts that are not 1, 2, 4 or 8 are refused, naming the key."""
    A, b = make(1, 40, 2, 9, seed=1)
    scanmod.TUNE.update({"summary": "thread", "chunk": 8})
    with pytest.raises(ValueError, match=r"TUNE\['summary'\] = 'thread'.*m = 9"):
        bd.block_diagonal_scan(A, b)
    A, b = make(1, 40, 2, 2, seed=1)
    scanmod.TUNE.update({"summary": "thread", "chunk": 8, "sumt_nw": 3})
    with pytest.raises(ValueError, match="sumt_nw"):
        bd.block_diagonal_scan(A, b)


@pytest.mark.parametrize("m", [2, 3, 16])
def test_summary_dot_end_to_end(m):
    """``TUNE['summary'] = 'dot'`` through the chunked forward and backward (h0, dh_final,
    varlen chunks with boundaries inside them) against float64."""
    scanmod.TUNE.update(summary="dot", sum_prec="ieee", chunk=12)
    A, b = make(2, 37, 3, m, seed=13 * m)
    cu = torch.tensor([0, 5, 30, 30, 61, 74], dtype=torch.int64, device=DEV)
    run_check(A.reshape(1, 74, 3, m, m), b.reshape(1, 74, 3, m), torch.randn(5, 3, m).to(DEV), cu, 1e-5)


def test_summary_dot_bad_tune():
    """Unknown summary kinds, precisions, non-power-of-two tile counts and pipeline depths
    outside [1, 16] raise, naming the key."""
    A, b = make(1, 40, 2, 2, seed=1)
    for key, val in (("summary", "fast"), ("sum_prec", "fp16"), ("sum_nt", 3), ("sum_ns", 0),
                     ("sum_ns", 2.5)):
        scanmod.TUNE.clear()
        scanmod.TUNE.update({"summary": "dot", "chunk": 8, key: val})
        with pytest.raises(ValueError, match=key):
            bd.block_diagonal_scan(A, b)

