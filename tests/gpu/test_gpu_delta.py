"""GPU checks of the Triton DeltaProduct path (forward + native backward, gated included) at full
head sizes in bf16 against an fp64 reference computed on the same GPU (issue 4).

Error ratio = ‖x − x_ref‖ / ‖x_ref‖ (relative RMS); bf16 must stay ≤ 5e-3, float32 ≤ 1e-4. The
reference runs on the same (bf16-rounded) inputs upcast to fp64.
The fp64 reference is the torch chunkwise path, itself checked against the token loop and the
generic scan on the CPU (tests/test_delta_chunk.py).
"""
import pytest
import torch

from benchmarks.delta_accuracy import bf16_case
from lrnn_scan.delta import chunk_delta_product

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _inputs(B, T, n_h, H, K, V, gated, beta_max, dtype, corr=0.0, seed=0):
    """``(fp64 inputs, inputs in dtype)``: benchmarks/delta_accuracy.py's case on the GPU (the
    reference takes the same rounded values; ``corr`` > 0: highly correlated keys)."""
    return bf16_case(B, T, n_h, H, K, V, gated, beta_max, seed, "cuda", dtype=dtype, corr=corr)


def _run(backend, xs, C=64):
    xs = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
    q, k, v, beta, g, h0 = xs
    o, f = chunk_delta_product(q, k, v, beta, g, initial_state=h0, output_final_state=True,
                               chunk_size=C, backend=backend)
    return xs, o, f


def _ratio(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("n_h,gated,beta_max,tune", [
    (1, False, 1.0, {}), (1, True, 2.0, {}), (2, True, 2.0, {}), (3, False, 2.0, {}), (4, True, 1.0, {}),
    # the gated dqkwg_bwd (fla #640 is a Hopper miscompile of its gated kernel with Triton 3.4-3.7.0)
    # in one K slice on 8 warps (the default until 2026-12-03: two slices on 4 warps), and the
    # "wu" form of the fused state kernels (scaled key copies)
    (2, True, 2.0, {"dqkwg_ksplit": 1, "dqkwg": (8, 3, 32)}), (3, True, 2.0, {"fuse_wu": "wu"}),
    # the backward state kernel in its first order at 3 stages (the default until 2026-11-25's
    # seventh session, when the lean order at 1 stage measured 0.87-0.91x fwd+bwd)
    (1, True, 2.0, {"state_bwd_lean": False, "state_bwd_fused": (4, 3, 64)}),
    (2, False, 2.0, {"state_bwd_lean": False, "state_bwd_fused": (4, 3, 64)}),
    # the WY backward through dA and A^T dA A^T (wy_bwd.py, the default until the sixty-first
    # session's wy_bwd_vn.py), in 4 K slices and unsplit at 8 warps (the default until the seventh
    # session, when 4 K slices at 4 warps measured 0.90x fwd+bwd); wy_bwd_vn unsplit, in 4 slices
    (3, False, 2.0, {"wy_bwd_vn": False}), (2, True, 2.0, {"wy_bwd_vn": False}),
    (2, True, 2.0, {"wy_bwd_vn": False, "wy_bwd_ksplit": 1, "wy_bwd": (8, 1, 64)}),
    (1, True, 2.0, {"wy_bwd_vn_ksplit": 1}), (4, False, 2.0, {"wy_bwd_vn_ksplit": 4}),
    # dqkwg_bwd doing wy_bwd_vn's work (opt-in since the sixty-first session) in 4 and 2 K slices
    (2, True, 2.0, {"dqkwg_fuse_wy": True, "dqkwg_ksplit": 4}), (3, False, 2.0, {"dqkwg_fuse_wy": True}),
    # the backward's dH chunk states in bf16 (opt-in since 2026-11-26: its error decides)
    (1, False, 2.0, {"dhs_16bit": True}), (2, True, 2.0, {"dhs_16bit": True}),
    # the lean backward state step reloading its key tile: the default does without the gate only
    # (since the ninth session, 2026-11-26); these rows with the gate, and without it the old form
    (1, True, 2.0, {"state_bwd_reload_k": True}), (2, False, 2.0, {"state_bwd_reload_k": False}),
    # the output kernels' Q H on fp32 copies of the bf16 tiles (the default takes them as stored
    # since the ninth session, 2026-11-26)
    (1, False, 2.0, {"output_raw_h": False}), (2, True, 2.0, {"output_raw_h": False}),
    # the sliced wy_bwd storing dbeta and dg before its second pass (opt-in since 2026-11-26)
    (1, True, 2.0, {"wy_bwd_vn": False, "wy_bwd_early_db": True}),
    (2, False, 2.0, {"wy_bwd_vn": False, "wy_bwd_early_db": True}),
    # the gated dqkwg_bwd's gate term from Z = dP~ ⊙ Q K^T (exact bf16 products; the default reads
    # it off its own dq, dk tiles since 2026-11-26, ninth session), one K slice and two
    (1, True, 2.0, {"dqkwg_dg_grads": False}), (4, True, 1.0, {"dqkwg_dg_grads": False}),
    (2, True, 2.0, {"dqkwg_dg_grads": False, "dqkwg_ksplit": 1}),
    # register caps on tri_inv64 and wy_bwd (opt-in since the tenth session, 2026-11-26): more
    # programs an SM, more spills
    (1, True, 2.0, {"wy_bwd_vn": False, "maxnreg": {"inv": 128, "wy_bwd": 168}}),
    (3, False, 2.0, {"wy_bwd_vn": False, "maxnreg": {"inv": 96, "wy_bwd": 128}}),
    # wy_bwd_vn_kernel capped at 168 registers: without the gate only (the default since the
    # sixty-fifth session, 2026-12-07), and uncapped, and both ways
    (3, False, 2.0, {"maxnreg": {"output_tok": 160}}),
    (1, True, 2.0, {"maxnreg": {"output_tok": 160, "wy_bwd_vn": 168}}),
    # the token-chunk output kernel with gradients (per-chunk states) and dqkwg_bwd's dO H^T on
    # the stored bf16 tiles (both opt-in since the twelfth session, 2026-11-26)
    (2, True, 2.0, {"token_chunk_output_grad": True}), (3, False, 2.0, {"token_chunk_output_grad": True}),
    (1, False, 2.0, {"dqkwg_raw_h": True}), (2, True, 1.0, {"dqkwg_raw_h": True}),
    (4, True, 2.0, {"token_chunk_output_grad": True, "dqkwg_raw_h": True}),
    # dqkwg_bwd's K slices on a third grid axis (the default until the sixtieth session,
    # 2026-12-03, when the slices of a chunk next to each other in launch order measured 0.981-0.987x)
    (3, False, 2.0, {"dqkwg_slices_adjacent": False}), (2, True, 2.0, {"dqkwg_slices_adjacent": False}),
    # the state kernels storing dH' and H by TMA (opt-in since the sixty-fourth session, 2026-12-07;
    # the defaults since the sixty-fifth take Vn, dH' and A^T dVn gated, H where Vn is not): always,
    # and none (the plain stores)
    (2, True, 2.0, {"state_bwd_tma_dh": True, "state_fwd_tma_hs": True, "state_fwd_tma_vn": False}),
    (2, True, 2.0, {"state_bwd_tma_dh": False, "state_fwd_tma_hs": False, "state_fwd_tma_vn": False,
                    "state_bwd_tma_x": False}),
    (3, False, 2.0, {"state_bwd_tma_dh": True, "state_fwd_tma_hs": True}),
    (1, True, 1.0, {"state_fwd_tma_hs": True, "state_fwd_tma_vn": False}),
    (2, False, 2.0, {"state_bwd_tma_dh": True, "state_bwd_tma_x": True, "state_fwd_tma_vn": True}),
    (4, True, 2.0, {"state_bwd_tma_dh": True, "state_bwd_tma_x": True, "state_fwd_tma_vn": True,
                    "dqkwg_tma_dk": True}),
    # the state backward forming P^T dO itself (no dv_local_kernel; opt-in since the sixty-fourth)
    (2, True, 2.0, {"state_bwd_local_dv": True}), (1, False, 2.0, {"state_bwd_local_dv": True})])
def test_bf16_full_heads_vs_fp64(n_h, gated, beta_max, tune, monkeypatch):
    from lrnn_scan.kernels.delta_product import function as fn
    # the launcher's buffers start as NaN: an element a kernel (a TMA store, say) leaves unwritten
    # fails here instead of passing on a value left in reused memory by the row before
    monkeypatch.setenv("LRNN_SCAN_POISON", "1")
    for key, val in tune.items():
        monkeypatch.setitem(fn.TUNE, key, val)
    B, T, H, K, V = 2, 1024, 4, 128, 128
    ref_in, lo_in = _inputs(B, T, n_h, H, K, V, gated, beta_max, torch.bfloat16, seed=n_h)
    xs_r, o_r, f_r = _run("torch", ref_in)
    xs_t, o_t, f_t = _run("triton", lo_in)
    gen = torch.Generator(device="cuda").manual_seed(9)
    do = torch.randn(o_r.shape, generator=gen, device="cuda", dtype=torch.float64)
    dh = torch.randn(f_r.shape, generator=gen, device="cuda", dtype=torch.float64)
    live_r = [x for x in xs_r if x is not None]
    live_t = [x for x in xs_t if x is not None]
    gr = torch.autograd.grad((o_r * do).sum() + (f_r * dh).sum(), live_r)
    gt = torch.autograd.grad((o_t.float() * do.float()).sum() + (f_t * dh.float()).sum(), live_t)
    names = ["dq", "dk", "dv", "dbeta"] + (["dg"] if gated else []) + ["dh0"]
    res = {"o": _ratio(o_t, o_r), "final": _ratio(f_t, f_r)}
    res.update({n: _ratio(a, b) for n, a, b in zip(names, gt, gr)})
    print(f"\n[delta bf16] n_h={n_h} gated={gated} beta_max={beta_max} ratios: " +
          " ".join(f"{k}={v:.2e}" for k, v in res.items()))
    for name, val in res.items():
        assert val == val and val <= 5e-3, (name, val)


@pytest.mark.parametrize("fp32_dot", ["ieee", "tf32x3"])
@pytest.mark.parametrize("n_h,gated", [(2, True), (3, False)])
def test_fp32_varlen_vs_fp64(n_h, gated, fp32_dot, monkeypatch):
    """float32 inputs (TF32 off) against fp64, varlen, every gradient, under each
    ``TUNE["fp32_dot"]``: exact fp32 dots, or three tf32 products a dot on the tensor cores."""
    from lrnn_scan.kernels.delta_product import function as fn
    monkeypatch.setitem(fn.TUNE, "fp32_dot", fp32_dot)
    # allow_tf32 by hand: pytest 9.2's monkeypatch cannot undo it (test_delta_triton.py)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _fp32_varlen_vs_fp64(n_h, gated)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _fp32_varlen_vs_fp64(n_h, gated):
    T, H, K, V = 700, 2, 64, 128
    cu = torch.tensor([0, 1, 129, 130, 500, 700], device="cuda")
    ref_in, _ = _inputs(1, T, n_h, H, K, V, gated, 2.0, torch.float32, seed=11)
    ref_in[5] = ref_in[5].new_zeros(5, H, K, V).normal_()
    lo_in = [x.float() if x is not None else None for x in ref_in]
    outs = []
    for backend, xs in (("torch", ref_in), ("triton", lo_in)):
        xs = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
        o, f = chunk_delta_product(*xs[:5], initial_state=xs[5], output_final_state=True,
                                   cu_seqlens=cu, backend=backend)
        live = [x for x in xs if x is not None]
        gg = torch.autograd.grad((o.double().sin()).sum() + f.double().cos().sum(), live)
        outs.append((o, f, gg))
    (o_r, f_r, g_r), (o_t, f_t, g_t) = outs
    assert _ratio(o_t, o_r) < 1e-4 and _ratio(f_t, f_r) < 1e-4
    for a, b in zip(g_t, g_r):
        assert _ratio(a, b) < 1e-4


def test_reflections_correlated_keys_finite():
    B, T, n_h, H, K, V = 1, 2048, 2, 2, 128, 128
    ref_in, lo_in = _inputs(B, T, n_h, H, K, V, True, 2.0, torch.bfloat16, corr=0.95, seed=5)
    lo_in[3] = torch.full_like(lo_in[3], 1.99)
    ref_in[3] = lo_in[3].double()
    xs_t, o_t, f_t = _run("triton", lo_in)
    # the recurrence is ill-conditioned here (near-reflections about almost parallel keys): the
    # requirement is finiteness; the error ratio is reported and held to a looser bound
    gt = torch.autograd.grad(o_t.float().sum() + f_t.sum(), [x for x in xs_t if x is not None])
    assert torch.isfinite(o_t).all() and torch.isfinite(f_t).all()
    assert all(torch.isfinite(x).all() for x in gt)
    _, o_r, f_r = _run("torch", ref_in)
    print(f"\n[delta bf16 beta=1.99 corr keys] o ratio {_ratio(o_t, o_r):.2e} final {_ratio(f_t, f_r):.2e}")
    assert _ratio(o_t, o_r) <= 3e-2 and _ratio(f_t, f_r) <= 3e-2


@pytest.mark.parametrize("n_h,gated,vn16,raw_h", [
    (2, True, False, False), (3, False, False, False), (4, True, False, False),
    (4, True, "no_grad", False), (2, False, "no_grad", False), (1, True, "no_grad", False),
    (1, False, "no_grad", False),
    # TUNE["output_raw_h"] (Q H on the stored bf16 tiles) with the predicated token-chunk state
    # store, per-chunk (n_h 1) and token-chunk kernels: both the default since 2026-11-26
    (1, True, "no_grad", True), (2, False, "no_grad", True), (4, True, "no_grad", True),
    # every chunk full (no cu_seqlens, T a multiple of 64): the gated default stores Vn by TMA
    # (TUNE["state_fwd_tma_vn"], since the sixty-fifth session), in bf16 here
    (1, True, "no_grad", "full"), (2, True, "no_grad", "full"), (4, True, False, "full")])
def test_token_chunk_output_forward_bf16(n_h, gated, vn16, raw_h, monkeypatch):
    """The forward without gradients (defaults: TUNE["token_chunk_output"], one state per 64 tokens
    at n_h > 1, and vn_16bit="no_grad", the pseudo-values in bf16), also with fp32 Vn: bf16 outputs
    and final state against fp64, varlen with sequences ending inside token chunks; ``raw_h ==
    "full"``: the defaults on whole chunks, one sequence of T = 1024 a batch row."""
    from lrnn_scan.kernels.delta_product import function as fn
    monkeypatch.setitem(fn.TUNE, "token_chunk_output", True)
    monkeypatch.setitem(fn.TUNE, "vn_16bit", vn16)
    full = raw_h == "full"
    if not full:
        monkeypatch.setitem(fn.TUNE, "output_raw_h", raw_h)
        monkeypatch.setitem(fn.TUNE, "token_state_pred", raw_h)   # the predicated state store too
    T, H, K, V = (1024 if full else 1000), 4, 128, 128
    cu = None if full else torch.tensor([0, 1, 63, 130, 130, T], device="cuda")
    B, N = (2, 2) if full else (1, 5)
    ref_in, lo_in = _inputs(B, T, n_h, H, K, V, gated, 2.0, torch.bfloat16, seed=n_h)
    ref_in[5] = ref_in[5].new_zeros(N, H, K, V).normal_() * 0.1
    lo_in[5] = ref_in[5].float()
    outs = []
    for backend, xs in (("torch", ref_in), ("triton", lo_in)):
        with torch.no_grad():
            outs.append(chunk_delta_product(*xs[:5], initial_state=xs[5], output_final_state=True,
                                            cu_seqlens=cu, backend=backend))
    (o_r, f_r), (o_t, f_t) = outs
    for name, a, b in (("o", o_t, o_r), ("final", f_t, f_r)):
        err = _ratio(a, b)
        assert err == err and err <= 5e-3, (name, err)


@pytest.mark.parametrize("n_h,gated", [(1, False), (2, True)])
def test_offsets_past_2_31_elements(n_h, gated):
    """Chunk-indexed buffers past 2^31 elements: the chunk-start states ``hs``/``dH`` hold
    ``NC·H·K·V`` = 2048·72·128·128 ≈ 2.4e9 elements here, so a kernel forming ``(c·H + h)·K·V``
    from an int32 chunk id wraps around. 32 sequences × 4096 sub-steps; the first and the last
    sequence (the largest chunk ids) against the fp64 reference run on that sequence alone,
    outputs, final states and every gradient (bf16 bound 5e-3); everything finite."""
    B, T, H, K, V = 32, 4096 // n_h, 72, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    q = r(B, T, H, K).bfloat16()
    k = torch.nn.functional.normalize(r(B, T, n_h, H, K), dim=-1).bfloat16()
    v = r(B, T, n_h, H, V).bfloat16()
    beta = torch.rand(B, T, n_h, H, generator=gen, device="cuda").bfloat16()   # β ≤ 1: the offsets are the point
    g = torch.nn.functional.logsigmoid(r(B, T, H) + 3).bfloat16() if gated else None
    h0 = r(B, H, K, V) * 0.1
    xs = [x.requires_grad_() if x is not None else None for x in (q, k, v, beta, g, h0)]
    o, f = chunk_delta_product(*xs[:5], initial_state=xs[5], output_final_state=True, backend="triton")
    do = r(*o.shape)
    dh = r(*f.shape)
    live = [x for x in xs if x is not None]
    gt = torch.autograd.grad((o.float() * do).sum() + (f * dh).sum(), live)
    assert torch.isfinite(o).all() and torch.isfinite(f).all()
    assert all(torch.isfinite(x).all() for x in gt)
    names = ["dq", "dk", "dv", "dbeta"] + (["dg"] if gated else []) + ["dh0"]
    for b in (0, B - 1):
        ref = [x.detach()[b:b + 1].double().requires_grad_() if x is not None else None for x in xs]
        o_r, f_r = chunk_delta_product(*ref[:5], initial_state=ref[5], output_final_state=True,
                                       backend="torch")
        gr = torch.autograd.grad((o_r * do[b:b + 1].double()).sum() + (f_r * dh[b:b + 1].double()).sum(),
                                 [x for x in ref if x is not None])
        res = {"o": _ratio(o[b:b + 1], o_r), "final": _ratio(f[b:b + 1], f_r)}
        res.update({n: _ratio(a[b:b + 1], c) for n, a, c in zip(names, gt, gr)})
        print(f"\n[delta 2^31] n_h={n_h} gated={gated} sequence {b}: " +
              " ".join(f"{key}={val:.2e}" for key, val in res.items()))
        for name, val in res.items():
            assert val == val and val <= 5e-3, (b, name, val)
