"""GPU checks of the block-diagonal / diagonal scan kernels at full sizes (skipped without CUDA).

Forward, final state and all gradients against an fp64 torch reference on the GPU (a log-depth
doubling scan, differentiated by autograd), fp32 and bf16, T = 65536, varlen, and a case whose
``A`` has more than 2^31 elements (int64 offsets). Outputs are NaN-poisoned before each run.
"""
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

os.environ["LRNN_SCAN_POISON"] = "1"

import lrnn_scan.kernels.block_diagonal as bd  # noqa: E402
DEV = "cuda"


def doubling(A, b):
    """fp64 Hillis-Steele scan over dim 1: h_t = A_t h_{t-1} + b_t from h_0 = 0."""
    T, d = A.shape[1], 1
    while d < T:
        b = torch.cat([b[:, :d], (A[:, d:] @ b[:, :-d].unsqueeze(-1)).squeeze(-1) + b[:, d:]], 1)
        A = torch.cat([A[:, :d], A[:, d:] @ A[:, :-d]], 1)
        d *= 2
    return b


def ref_scan(A, b, h0, cu):
    """Returns (h, h_final) in fp64, differentiable."""
    if cu is None:
        segs = [(A, b, h0)]
    else:
        c = cu.tolist()
        segs = [(A[:, x:y], b[:, x:y], h0[i:i + 1] if h0 is not None else None)
                for i, (x, y) in enumerate(zip(c[:-1], c[1:]))]
    hs, fs = [], []
    for Ai, bi, hi in segs:
        if Ai.shape[1] == 0:
            fs.append(hi if hi is not None else torch.zeros_like(bi[:, 0:1].sum(1)))
            hs.append(bi)
            continue
        if hi is not None:
            first = bi[:, :1] + (Ai[:, :1] @ hi[:, None, ..., None]).squeeze(-1)
            bi = torch.cat([first, bi[:, 1:]], 1)
        h = doubling(Ai, bi)
        hs.append(h)
        fs.append(h[:, -1])
    return torch.cat(hs, 1), torch.cat(fs, 0)


def rel(x, y):
    return ((x.double() - y.double()).norm() / y.double().norm()).item()


def make(B, T, H, m, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    A = 1 - torch.rand(B, T, H, m, m, device=DEV, generator=g)   # (0, 1]: no 0 / 0 rows at m = 1
    A = A / A.sum(-1, keepdim=True) * (2 * torch.rand(B, T, H, m, 1, device=DEV, generator=g) - 1)
    b = torch.randn(B, T, H, m, device=DEV, generator=g)
    return A.to(dtype).contiguous(), b.to(dtype).contiguous()


def check(A, b, h0, cu, tol, heads=None, final=True):
    """Outputs, final state and gradients against fp64; ``final=False``: the loss reads ``h``
    only, so the scan's backward gets no final-state gradient (None, not zeros)."""
    A.requires_grad_(True)
    b.requires_grad_(True)
    if h0 is not None:
        h0.requires_grad_(True)
    h, hf = bd.block_diagonal_scan(A, b, h0, True, cu)
    g, gf = torch.randn_like(h), torch.randn_like(hf)
    ins = (A, b) + ((h0,) if h0 is not None else ())
    gf = gf if final else torch.zeros_like(gf)
    grads = torch.autograd.grad((h.float() * g.float()).sum() + ((hf * gf).sum() if final else 0), ins)
    sl = slice(None) if heads is None else heads
    Ad = A.detach()[:, :, sl].double().requires_grad_()
    bdd = b.detach()[:, :, sl].double().requires_grad_()
    h0d = h0.detach()[:, sl].double().requires_grad_() if h0 is not None else None
    hr, hfr = ref_scan(Ad, bdd, h0d, cu)
    ins_r = (Ad, bdd) + ((h0d,) if h0 is not None else ())
    rgr = torch.autograd.grad((hr * g[:, :, sl].double()).sum() + (hfr * gf[:, sl].double()).sum(), ins_r)
    errs = {"h": rel(h[:, :, sl], hr), "h_final": rel(hf[:, sl], hfr)}
    for name, x, y in zip(("dA", "db", "dh0"), grads, rgr):
        assert not torch.isnan(x).any(), name
        errs[name] = rel(x[:, :, sl] if name != "dh0" else x[:, sl], y)
    assert not torch.isnan(h).any() and not torch.isnan(hf).any()
    print(errs)
    for k, v in errs.items():
        assert v < tol, (k, v, errs)
    return errs


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 16, 32])   # 3, 5, 7: padded rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_size(m, dtype):
    A, b = make(2, 2048, 512 // m, m, dtype, seed=m)
    h0 = torch.randn(2, A.shape[2], m, device=DEV)
    check(A, b, h0, None, 1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])   # 2, 8: chunked re-runs from carries
def test_long_chunked_varlen(m):
    T = 65536
    A, b = make(1, T, 256 // m, m, torch.float32, seed=100 + m)
    cu = torch.tensor([0, 5, 30001, 30001, 47000, T], device=DEV, dtype=torch.int64)
    h0 = torch.randn(5, A.shape[2], m, device=DEV)
    check(A, b, h0, cu, 1e-4)
    check(A.detach().clone(), b.detach().clone(), None, None, 1e-4)


@pytest.mark.parametrize("m,rerun_len", [(4, 256), (6, 512), (8, 256)])
def test_rerun_over_summary_chunks(m, rerun_len):
    """The opt-in ``TUNE['rerun_len']`` (``summary.rerun_factor``: the chunked forward's re-run
    over several summary chunks, from the carry into every k-th) at full size: B1 T65536 varlen
    with sequence ends inside chunks and h0, then B1 without offsets, fp32 against fp64."""
    T = 65536
    A, b = make(1, T, 384 // m, m, torch.float32, seed=1100 + m)
    cu = torch.tensor([0, 5, 30001, 30001, 47000, T], device=DEV, dtype=torch.int64)
    try:
        bd.scan.TUNE.update(rerun_len=rerun_len)
        check(A, b, torch.randn(5, A.shape[2], m, device=DEV), cu, 1e-4)
        check(A.detach().clone(), b.detach().clone(), None, None, 1e-4)
    finally:
        bd.scan.TUNE.clear()


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16, 32])
def test_gradients_without_final_state(m):
    """A loss on ``h`` alone: every backward runs without a final-state gradient (the autograd
    Function passes None, not a zero tensor): few programs (TMA and look-back backwards at
    m = 1, 2, 4), batch 1 (chunked or look-back backwards) and, for m <= 4, many programs;
    fp32 against fp64 on a subset of the heads."""
    shapes = [(8, 2048, 768), (1, 16384, 768)] + ([(8, 2048, 4096)] if m <= 4 else [])
    for i, (B, T, N) in enumerate(shapes):
        H = N // m
        A, b = make(B, T, H, m, torch.float32, seed=900 + 10 * m + i)
        check(A, b, None, None, 1e-4, heads=slice(None, None, max(1, H // 48)), final=False)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16, 32])
def test_inference_plans_batch1(m):
    """Forwards without gradients take their own plans (look-backs, chunked rings without chunk
    products for a backward; plan.py): B1 T16384 N768, the benchmark's batch-1 shape, with h0,
    and varlen with boundaries inside chunks, h and the final states against fp64."""
    H = 768 // m if m != 3 else 256
    A, b = make(1, 16384, H, m, torch.float32, seed=800 + m)
    cu = torch.tensor([0, 7, 5000, 5000, 12289, 16384], device=DEV, dtype=torch.int64)
    for h0, c in ((torch.randn(1, H, m, device=DEV), None), (torch.randn(5, H, m, device=DEV), cu)):
        with torch.no_grad():
            h, hf = bd.block_diagonal_scan(A, b, h0, True, c)
        hr, hfr = ref_scan(A.double(), b.double(), h0.double(), c)
        assert not torch.isnan(h).any() and not torch.isnan(hf).any()
        assert rel(h, hr) < 1e-4 and rel(hf, hfr) < 1e-4, (rel(h, hr), rel(hf, hfr))


@pytest.mark.parametrize("prec", ["tf32x3", "ieee"])
@pytest.mark.parametrize("m", [2, 4, 8, 16, 32])
def test_summary_dot_chunked(m, prec):
    """Tensor-core chunk summaries (``TUNE['summary'] = 'dot'``, summary.py) in 256-step varlen
    chunks with sequence ends inside chunks, h0 and dh_final: fp32 and bf16 against fp64."""
    tune = bd.scan.TUNE
    try:
        tune.update(summary="dot", sum_prec=prec, chunk=256)
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
            A, b = make(1, 6002, 384 // m, m, dtype, seed=500 + m)
            check(A, b, torch.randn(5, 384 // m, m, device=DEV), cu, tol)
    finally:
        tune.clear()


@pytest.mark.parametrize("m", [8, 16, 32])
def test_summary_dot_long_memory(m):
    """Chunk products that matter: near-orthogonal transitions (0.999 Q_t) keep the state for
    thousands of steps, so an error in a chunk's product ``P`` reaches every later output (with
    ``make``'s contracting blocks the products vanish within a chunk and their precision is never
    seen). The default summaries (tf32x3 / ieee) must meet fp32's 1e-4; plain tf32 must not
    (shows that the test sees the summaries' precision)."""
    g = torch.Generator(device=DEV).manual_seed(600 + m)
    q, _ = torch.linalg.qr(torch.randn(2, 3001, 192 // m, m, m, device=DEV, generator=g, dtype=torch.float64))
    A = (0.999 * q).float().contiguous()
    b = torch.randn(2, 3001, 192 // m, m, device=DEV, generator=g)
    tune = bd.scan.TUNE
    try:
        tune.update(chunk=256)
        check(A.clone(), b.clone(), torch.randn(2, 192 // m, m, device=DEV), None, 1e-4)
        tune.update(sum_prec="tf32")
        errs = check(A.clone(), b.clone(), None, None, float("inf"))
        assert max(errs.values()) > 1e-4, errs
    finally:
        tune.clear()


@pytest.mark.parametrize("chunk", [64, 256])
@pytest.mark.parametrize("m", [3, 4, 5, 8])
def test_summary_thread_chunked(m, chunk):
    """One-block-per-thread chunk summaries (``TUNE['summary'] = 'thread'``, summary_thread.py) in
    varlen chunks with sequence ends inside chunks, h0 and dh_final: fp32 and bf16 against fp64;
    then near-orthogonal transitions (0.999 Q_t, as test_summary_dot_long_memory), where an error in
    a chunk's product reaches every later output, at fp32's 1e-4."""
    tune = bd.scan.TUNE
    try:
        tune.update(summary="thread", chunk=chunk)
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
            A, b = make(1, 6002, 384 // m, m, dtype, seed=700 + m)
            check(A, b, torch.randn(5, 384 // m, m, device=DEV), cu, tol)
        g = torch.Generator(device=DEV).manual_seed(800 + m)
        q, _ = torch.linalg.qr(torch.randn(2, 3001, 96 // m, m, m, device=DEV, generator=g, dtype=torch.float64))
        A = (0.999 * q).float().contiguous()
        b = torch.randn(2, 3001, 96 // m, m, device=DEV, generator=g)
        check(A, b, torch.randn(2, 96 // m, m, device=DEV), None, 1e-4)
    finally:
        tune.clear()


def test_diagonal_api_long():
    T, N = 65536, 512
    a = torch.rand(2, T, N, device=DEV).requires_grad_()
    x = torch.randn(2, T, N, device=DEV).requires_grad_()
    h, hf = bd.diagonal_scan(a, x, None, True)
    hr, hfr = ref_scan(a.detach().double()[..., None, None], x.detach().double()[..., None], None, None)
    assert rel(h, hr[..., 0]) < 1e-5 and rel(hf, hfr[..., 0]) < 1e-5


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory < 40e9,
                    reason="needs ~30 GB of GPU memory")
@pytest.mark.parametrize("H,m,tune", [(160, 16, {}),
                                      (520, 8, {"summary": "thread", "chunk": 256})])  # int64 offsets
# in the thread summaries
def test_more_than_2_31_elements(H, m, tune):
    B, T = 1, 65536
    assert B * T * H * m * m > 2 ** 31
    A, b = make(B, T, H, m, torch.bfloat16, seed=7)
    heads = torch.tensor([0, H - 1], device=DEV)
    try:
        bd.scan.TUNE.update(tune)
        check(A, b, None, None, 2e-2, heads=heads)
    finally:
        bd.scan.TUNE.clear()


@pytest.mark.parametrize("variant,summary", [("ring2", "ring"), ("g4", "v1"), ("v1", "ring"),
                                             ("ring8", "ring")])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_forward_variants(variant, summary, m):
    """The non-default forward kernels and summaries (the default ring4 runs above), one pass and
    in 256-step varlen chunks; m = 1 through the block kernels."""
    tune = bd.scan.TUNE
    try:
        tune.update(variant=variant, summary=summary, diag_variant="ring", chunk=0)
        A, b = make(2, 3001, 384 // m, m, torch.float32, seed=200 + m)
        check(A, b, torch.randn(2, 384 // m, m, device=DEV), None, 1e-4)
        tune["chunk"] = 256
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        A, b = make(1, 6002, 384 // m, m, torch.float32, seed=300 + m)
        check(A, b, torch.randn(5, 384 // m, m, device=DEV), cu, 1e-4)
    finally:
        tune.clear()


# the backward kernels forced: the rings (8 and 16 slots) and the one-step kernel with ``lam``
# passed by shuffles (bwd._bd_bwd_gather, TUNE['bwd_gather'])
_BWD_KERNELS = {"ring2": dict(bwd_variant="ring2"), "ring4": dict(bwd_variant="ring4"),
                "gather": dict(bwd_variant="v1", bwd_gather=True)}


@pytest.mark.parametrize("bwd", sorted(_BWD_KERNELS))
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 32])
def test_backward_kernels(m, bwd):
    """Each backward kernel, one pass fp32 with h0 and dh_final, then chunked varlen in bf16;
    m = 1 through the block kernels."""
    tune = bd.scan.TUNE
    try:
        tune.update(**_BWD_KERNELS[bwd], diag_variant="ring", chunk=0)
        A, b = make(2, 3001, 384 // m, m, torch.float32, seed=400 + m)
        check(A, b, torch.randn(2, 384 // m, m, device=DEV), None, 1e-4)
        tune["chunk"] = 256
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        A, b = make(1, 6002, 384 // m, m, torch.bfloat16, seed=500 + m)
        check(A, b, torch.randn(5, 384 // m, m, device=DEV), cu, 5e-3)
    finally:
        tune.clear()


@pytest.mark.parametrize("variant", ["ring2", "ring4", "ring8"])
@pytest.mark.parametrize("m", [3, 5, 6, 7, 12])
def test_gather_padded_rows(m, variant):
    """The forward ring and the one-step backward by shuffles (``ring_gather``, ``bwd_gather``) at
    m below its power of two (padded rows in their layouts): one pass fp32 with h0, then chunked
    varlen in bf16, all gradients against fp64."""
    tune = bd.scan.TUNE
    try:
        tune.update(variant=variant, ring_gather=True, bwd_variant="v1", bwd_gather=True, chunk=0)
        H = 384 // m
        A, b = make(2, 3001, H, m, torch.float32, seed=800 + m)
        check(A, b, torch.randn(2, H, m, device=DEV), None, 1e-4)
        tune["chunk"] = 256
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        A, b = make(1, 6002, H, m, torch.bfloat16, seed=900 + m)
        check(A, b, torch.randn(5, H, m, device=DEV), cu, 5e-3)
    finally:
        tune.clear()


@pytest.mark.parametrize("cfg", [(64, 32, 2), (256, 8, 2), (128, 16, 2), (32, 64, 2),
                                 (32, 64, 4), (16, 64, 2), (16, 64, 4), (16, 128, 4)])
# 16 x 64: the H100's tiles, 32 x 64 the H200's (scan._DIAG_BY_DEVICE; with 4 warps its backward,
# _DIAG_BWD_BY_DEVICE, passed on an H200 on 2026-11-28 before it became the default). (128, 16, 2) was a strict xfail ("dA left NaN") until 2026-11-26: its seed drew an
# exact 0 from torch.rand at m = 1, so the input row was 0 / 0 = NaN; make() draws from (0, 1]
# since 81e3883, and the row passed on an H100 (XPASS).
def test_diag_tiles(cfg):
    """m = 1 tile shapes (forward and backward keys), one pass with h0 and chunked varlen with
    chunk boundaries that are not multiples of the tile length."""
    tune = bd.scan.TUNE
    bt, bn, nw = cfg
    try:
        tune.update(bt=bt, bn=bn, num_warps_diag=nw, bt_bwd=bt, bn_bwd=bn, nw_bwd=nw, chunk=0,
                    diag_tma=False)   # the tile kernel itself, not the TMA forward of few programs
        A, b = make(2, 3001, 768, 1, torch.float32, seed=600 + bt)
        check(A, b, torch.randn(2, 768, 1, device=DEV), None, 1e-4)
        tune["chunk"] = 200
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        A, b = make(1, 6002, 768, 1, torch.float32, seed=700 + bt)
        check(A, b, torch.randn(5, 768, 1, device=DEV), cu, 1e-4)
    finally:
        tune.clear()


# (m, B): N4096 shapes inside the H200's wave-tail bands (programs per SM): m = 1 B5 backward
# (1.9, 3.5], B9 forward (4, 7] and backward (4, 4.75], B13 backward (6, 7.5] (scan._DIAG_BANDS);
# m = 8 B3 forward ring8, B5 backward ring2, B9 forward ring2 and backward v1; m = 16 B5 ring2, B9 g4 forwards;
# m = 32 B1 and B8 backward v1 (scan._VARIANT_BANDS). T = 512: the bands count programs, not steps.
@pytest.mark.parametrize("m,B", [(1, 5), (1, 9), (1, 13), (8, 3), (8, 5), (8, 9), (16, 5), (16, 9), (32, 1),
                                 (32, 8)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
def test_wave_tail_bands(m, B, dtype, tol):
    """The kernels the band tables pick, against fp64 with all gradients; on an H200 the test
    first asserts that the shape is inside a band (so it cannot pass on the default kernels)."""
    S, H, dev = bd.scan, 4096 // m, torch.device(DEV)
    if "H200" in torch.cuda.get_device_name():
        if m == 1:
            picked = [S._diag_band(4096, B, dev), S._diag_band(4096, B, dev, bwd=True)]
        else:
            nprog = B * -(-H // S._bd_cfg(m)[1])
            picked = [S._variant_band(m, nprog, dev), S._variant_band(m, nprog, dev, bwd=True)]
        assert any(p is not None for p in picked), (m, B, picked)
    A, b = make(B, 512, H, m, dtype, seed=40 + B * m)
    check(A, b, torch.randn(B, H, m, device=DEV), None, tol)


@pytest.mark.parametrize("m", [12, 16, 24, 32])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
def test_backward_warps(m, dtype, tol):
    """The backward on fewer warps than the forward (``scan._bwd_warps``: 1 at ``mp = 16``, 2 at
    ``mp = 32``), also with ``m`` below its power of two (masked rows): few programs (B8 N768,
    odd T) and many (B8 N4096), with h0 and all gradients against fp64 on a subset of heads."""
    S = bd.scan
    assert S._bwd_warps(S._bd_cfg(m)[0], S._bd_cfg(m)[2]) == (1 if m <= 16 else 2)
    for i, (T, N) in enumerate(((1001, 768), (300, 4096))):
        H = N // m
        A, b = make(8, T, H, m, dtype, seed=60 + 2 * m + i)
        check(A, b, torch.randn(8, H, m, device=DEV), None, tol, heads=slice(None, None, max(1, H // 48)))


@pytest.mark.parametrize("N", [4098, 4100, 4104, 4099])   # row_divisor 2, 4, 8, 1
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
@pytest.mark.parametrize("path", ["default", "tile", "lookback"])
def test_diag_unaligned_rows(N, dtype, tol, path):
    """m = 1 rows whose length is not a multiple of 16 (the kernels' ``NV`` constexpr,
    ``_host.row_divisor``): the default plan, the tile kernel and the look-back forward and
    backward forced, one pass with h0 and varlen with boundaries inside chunks (chunked but for
    the look-backs)."""
    tune = bd.scan.TUNE
    try:
        tune.update({"default": {"chunk": 0}, "tile": {"chunk": 0, "diag_tma": False},
                     "lookback": {"fwd_lookback": True, "bwd_lookback": True}}[path])
        A, b = make(2, 1001, N, 1, dtype, seed=N)
        check(A, b, torch.randn(2, N, 1, device=DEV), None, tol)
        if path != "lookback":
            tune["chunk"] = 200
        cu = torch.tensor([0, 5, 700, 700, 2002], device=DEV, dtype=torch.int64)
        check(A.detach().view(1, 2002, N, 1, 1), b.detach().view(1, 2002, N, 1),
              torch.randn(4, N, 1, device=DEV), cu, tol)
    finally:
        tune.clear()


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9,
                    reason="TMA needs compute capability 9+")
@pytest.mark.parametrize("cfg", [None, (64, 16, 1, 4), (64, 32, 1, 3), (128, 16, 2, 3), (32, 8, 1, 6),
                                 (64, 64, 2, 3), (16, 64, 1, 4), (16, 128, 1, 4), (16, 64, 1, 3),
                                 (32, 64, 1, 4), (32, 64, 1, 3)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_diag_tma(cfg, dtype, tol):
    """The TMA forward (tma.py; None = the default configuration; the H200's many-program rows:
    64 x 64 on 2 warps, 16 x 64 (4 or 3 stages), 16 x 128 and 32 x 64 (4 or 3) on one) with
    gradients: one pass with h0 at B8 T3001 N768 and varlen with boundaries off the tiles."""
    tune = bd.scan.TUNE
    try:
        tune.update(diag_tma=True, chunk=0)
        if cfg is not None:
            tune.update(tma_bt=cfg[0], tma_bn=cfg[1], tma_nw=cfg[2], tma_ns=cfg[3])
        A, b = make(8, 3001, 768, 1, dtype, seed=800)
        check(A, b, torch.randn(8, 768, 1, device=DEV), None, tol)
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        A, b = make(1, 6002, 768, 1, dtype, seed=801)
        check(A, b, torch.randn(5, 768, 1, device=DEV), cu, tol)
    finally:
        tune.clear()


@pytest.mark.skipif(torch.cuda.is_available() and (torch.cuda.get_device_capability()[0] < 9 or
                                                   torch.cuda.get_device_properties(0).total_memory < 40e9),
                    reason="TMA (compute capability 9+) and ~30 GB of GPU memory")
@pytest.mark.parametrize("B,T,N,dtype,tol", [(1, 2 ** 21, 1040, torch.bfloat16, 5e-3),
                                             (4, 2 ** 16, 8448, torch.float32, 1e-5)])
def test_diag_tma_more_than_2_31_elements(B, T, N, dtype, tol):
    """2.2e9 elements, int64 store offsets, int32 TMA coordinates; checked on three channels of
    every sequence against the fp64 reference. bf16 ``(1, 2^21, 1040)``: few programs, TMA forced;
    fp32 ``(4, 2^16, 8448)``: the default rule, on an H200 the many-program TMA row
    (``tma._MANY_BY_DEVICE``; 528 programs at BN = 64, 4 an SM), elsewhere the tile kernel."""
    a = torch.empty(B, T, N, device=DEV, dtype=dtype).uniform_(-1, 1)
    x = torch.empty(B, T, N, device=DEV, dtype=dtype).normal_()
    assert a.numel() > 2 ** 31
    tune = bd.scan.TUNE
    try:
        if B == 1:
            tune.update(diag_tma=True, chunk=0, fwd_lookback=False)
        h, hf = bd.diagonal_scan(a, x, None, True)
    finally:
        tune.clear()
    cols = torch.tensor([0, N // 2, N - 1], device=DEV)
    hr, hfr = ref_scan(a[:, :, cols].double()[..., None, None], x[:, :, cols].double()[..., None], None, None)
    assert rel(h[:, :, cols], hr[..., 0]) < tol and rel(hf[:, cols], hfr[..., 0]) < 1e-4


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9,
                    reason="TMA needs compute capability 9+")
@pytest.mark.parametrize("cfg", [None, (64, 16, 1, 4, False), (32, 32, 1, 3, True), (128, 16, 2, 3, True),
                                 (64, 64, 2, 3, True), (16, 16, 1, 6, True)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_diag_tma_backward(cfg, dtype, tol):
    """The m = 1 TMA backward (tma_bwd.py; None = its default tiles; (BT, BN, warps, stages,
    FLIP)) after the default forward: one pass with h0 at B8 T3001 N768, varlen with boundaries
    off the tiles and an empty sequence (masked stores), and T = 65536 at batch 1 without h0."""
    tune = bd.scan.TUNE
    try:
        tune.update(diag_tma_bwd=True)
        if cfg is not None:
            tune.update({f"tma_bwd_{k}": v for k, v in zip(("bt", "bn", "nw", "ns", "flip"), cfg)})
        A, b = make(8, 3001, 768, 1, dtype, seed=850)
        check(A, b, torch.randn(8, 768, 1, device=DEV), None, tol)
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        A, b = make(1, 6002, 768, 1, dtype, seed=851)
        check(A, b, torch.randn(5, 768, 1, device=DEV), cu, tol)
        A, b = make(1, 65536, 768, 1, dtype, seed=852)
        check(A, b, None, None, tol, final=False)
    finally:
        tune.clear()


@pytest.mark.skipif(torch.cuda.is_available() and (torch.cuda.get_device_capability()[0] < 9 or
                                                   torch.cuda.get_device_properties(0).total_memory < 60e9),
                    reason="TMA (compute capability 9+) and ~40 GB of GPU memory")
def test_diag_tma_backward_more_than_2_31_elements():
    """bf16 ``(1, 2^21, 1040)``: 2.2e9 elements, int64 offsets of the masked loads and the TMA
    stores' int32 coordinates, through the m = 1 TMA backward (forced); the gradients of three
    channels against the fp64 reference."""
    B, T, N = 1, 2 ** 21, 1040
    a = torch.empty(B, T, N, device=DEV, dtype=torch.bfloat16).uniform_(-1, 1).requires_grad_()
    x = torch.empty(B, T, N, device=DEV, dtype=torch.bfloat16).normal_().requires_grad_()
    tune = bd.scan.TUNE
    try:
        tune.update(diag_tma_bwd=True)
        h, _ = bd.diagonal_scan(a, x)
        g = torch.randn_like(h)
        da, dx = torch.autograd.grad((h * g).sum(), (a, x))
    finally:
        tune.clear()
    cols = torch.tensor([0, N // 2, N - 1], device=DEV)
    ad = a.detach()[:, :, cols].double()[..., None, None].requires_grad_()
    xd = x.detach()[:, :, cols].double()[..., None].requires_grad_()
    hr, _ = ref_scan(ad, xd, None, None)
    dar, dxr = torch.autograd.grad((hr[..., 0] * g[:, :, cols].double()).sum(), (ad, xd))
    assert rel(da[:, :, cols], dar[..., 0, 0]) < 5e-3 and rel(dx[:, :, cols], dxr[..., 0]) < 5e-3


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9,
                    reason="TMA needs compute capability 9+")
@pytest.mark.parametrize("m,cfg,tma_bwd", [(2, None, True), (2, None, False), (2, (32, 8, 1, 3), True),
                                           (2, (64, 2, 2, 4), True), (4, None, True), (4, None, False),
                                           (4, (64, 2, 1, 3), True), (4, (16, 8, 1, 5), True)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_block_tma(m, cfg, tma_bwd, dtype, tol):
    """The m = 2 and m = 4 TMA forwards (tma_blocks.py; None = the forced default configuration)
    with gradients, by the TMA backward (tma_blocks_bwd.py) or the other one: one pass with h0 at
    B8 T3001 N768 and varlen with boundaries off the tiles."""
    tune = bd.scan.TUNE
    try:
        tune.update({f"bd{m}_tma": True, f"bd{m}_tma_bwd": tma_bwd, "chunk": 0})
        if cfg is not None:
            tune.update({f"tma{m}_{k}": v for k, v in zip(("bt", "bh", "nw", "ns"), cfg)})
        A, b = make(8, 3001, 768 // m, m, dtype, seed=900 + m)
        check(A, b, torch.randn(8, 768 // m, m, device=DEV), None, tol)
        cu = torch.tensor([0, 5, 1000, 1000, 2500, 6002], device=DEV, dtype=torch.int64)
        A, b = make(1, 6002, 768 // m, m, dtype, seed=910 + m)
        check(A, b, torch.randn(5, 768 // m, m, device=DEV), cu, tol)
    finally:
        tune.clear()


@pytest.mark.skipif(torch.cuda.is_available() and (torch.cuda.get_device_capability()[0] < 9 or
                                                   torch.cuda.get_device_properties(0).total_memory < 60e9),
                    reason="TMA (compute capability 9+) and ~30 GB of GPU memory")
@pytest.mark.parametrize("m", [2, 4])
def test_block_tma_more_than_2_31_elements(m):
    """bf16 ``(1, 2^21, 1040 / m, m)``: ``h`` alone has 2.2e9 elements (int64 store offsets, int32
    TMA coordinates); the forward checked on two blocks against the fp64 reference."""
    T, H = 2 ** 21, 1040 // m
    A = torch.empty(1, T, H, m, m, device=DEV, dtype=torch.bfloat16).uniform_(-1 / m, 1 / m)
    x = torch.empty(1, T, H, m, device=DEV, dtype=torch.bfloat16).normal_()
    assert x.numel() > 2 ** 31
    tune = bd.scan.TUNE
    try:
        tune.update({f"bd{m}_tma": True, "chunk": 0})
        h, hf = bd.block_diagonal_scan(A, x, None, True)
    finally:
        tune.clear()
    heads = torch.tensor([0, H - 1], device=DEV)
    hr, hfr = ref_scan(A[:, :, heads].double(), x[:, :, heads].double(), None, None)
    assert rel(h[:, :, heads], hr) < 5e-3 and rel(hf[:, heads], hfr) < 1e-4


def _time_major_check(a, x, h0, cu, tol, rows=None, final=True):
    """``diagonal_scan(time_dim=2)`` on ``(B, N, T)``: outputs, final state and the gradients of
    ``a``, ``x``, ``h0`` against ``ref_scan`` on ``rows`` (all by default), NaN-poisoned outputs.
    In 16-bit ``da = mu * h_{t-1}`` holds two roundings (the stored ``h`` and ``da`` itself, as in
    the ``(B, T, N)`` kernels and accelerated-scan): its bound is ``2 * tol`` (6.1e-3 seen at 5e-3
    elsewhere under the interpreter), every other error stays under ``tol``."""
    leaves = [v.requires_grad_() for v in (a, x) + ((h0,) if h0 is not None else ())]
    h, hf = bd.diagonal_scan(a, x, h0, True, cu, time_dim=2)
    g, gf = torch.empty_like(h).normal_(), torch.randn_like(hf)
    gf = gf if final else torch.zeros_like(gf)  # final=False: the loss reads h only
    grads = torch.autograd.grad((h.float() * g.float()).sum() + ((hf * gf).sum() if final else 0), leaves)
    sl = slice(None) if rows is None else rows
    ref_in = [v.detach()[:, sl].double().requires_grad_() for v in (a, x)]
    h0r = h0.detach()[:, sl].double().requires_grad_() if h0 is not None else None
    hr, hfr = ref_scan(ref_in[0].transpose(1, 2)[..., None, None], ref_in[1].transpose(1, 2)[..., None],
                       None if h0r is None else h0r[..., None], cu)
    rg = torch.autograd.grad((hr[..., 0] * g[:, sl].transpose(1, 2).double()).sum()
                             + (hfr[..., 0] * gf[:, sl].double()).sum(), ref_in + ([h0r] if h0r is not None else []))
    errs = {"h": rel(h[:, sl], hr[..., 0].transpose(1, 2)), "h_final": rel(hf[:, sl], hfr[..., 0])}
    for name, u, v in zip(("da", "db", "dh0"), grads, rg):
        errs[name] = rel(u[:, sl], v)
    print(errs)
    low = a.dtype != torch.float32
    assert all(v < (2 * tol if k == "da" and low else tol) for k, v in errs.items()), errs


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
@pytest.mark.parametrize("varlen", [False, True])
def test_time_major_long(dtype, tol, varlen):
    """Time contiguous (time_major.py), T = 65536; varlen boundaries off the 2048-step tiles."""
    B, N, T = (1 if varlen else 2), 96, 65536
    A, b = make(B, T, N, 1, dtype, seed=11)
    a, x = A[..., 0, 0].transpose(1, 2).contiguous(), b[..., 0].transpose(1, 2).contiguous()
    cu = torch.tensor([0, 1000, 1001, 40000, T], device=DEV) if varlen else None
    _time_major_check(a, x, torch.randn(4 if varlen else B, N, device=DEV), cu, tol)
    _time_major_check(a.detach().clone(), x.detach().clone(), None, cu, tol, final=False)


# row_divisor 4, 8, 2, 1; 4396 and 6136: 3 and 16 tiles of TM_TAIL = 128 past the 2048-step tiles
@pytest.mark.parametrize("T", [4100, 4104, 4098, 4099, 4396, 6136])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-3)])
def test_time_major_unaligned_rows(T, dtype, tol):
    """Time contiguous rows whose length is not a multiple of 16 (the kernels' ``TV`` constexpr,
    ``_host.row_divisor``), with and without h0 and the final state's gradient."""
    A, b = make(2, T, 96, 1, dtype, seed=T)
    a, x = A[..., 0, 0].transpose(1, 2).contiguous(), b[..., 0].transpose(1, 2).contiguous()
    _time_major_check(a, x, torch.randn(2, 96, device=DEV), None, tol)
    _time_major_check(a.detach().clone(), x.detach().clone(), None, None, tol, final=False)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory < 40e9,
                    reason="needs ~35 GB of GPU memory")
def test_time_major_more_than_2_31_elements():
    N, T = 32800, 65536
    assert N * T > 2 ** 31
    a = torch.empty(1, N, T, device=DEV, dtype=torch.bfloat16).uniform_(-1, 1)
    x = torch.empty(1, N, T, device=DEV, dtype=torch.bfloat16).normal_()
    _time_major_check(a, x, None, None, 5e-3, rows=torch.tensor([0, N // 2, N - 1], device=DEV))
