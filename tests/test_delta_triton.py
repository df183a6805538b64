"""Triton DeltaProduct kernels (forward + native backward) under TRITON_INTERPRET=1 on the CPU,
against the fp64 loop: outputs, final states, all gradients (issue 4). Every buffer the launcher
allocates starts as NaN (``LRNN_SCAN_POISON=1``), so an element read before it is written, or an
output element never written, shows up as a non-finite result. The opt-in ``function.TUNE``
variants (fused W/U, batched 16x16 inverses) run the same checks."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this module

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from lrnn_scan.delta import chunk_delta_product  # noqa: E402
from test_delta_chunk import loop_fp64, make_inputs  # noqa: E402

_ALL = lambda C, K, V: True                  # noqa: E731
_C64 = lambda C, K, V: C == 64               # noqa: E731  tri_inv64 / wy_fwd's blocked inverse
# name -> (TUNE overrides, which cases (chunk, K, V) it changes)
VARIANTS = {
    "default": ({}, _ALL),                                            # fuse_wu "assoc", inv_batched
    "stored_wu": ({"fuse_wu": False, "inv_batched": False}, _ALL),    # wu_fwd stores W, U
    "fuse_wu": ({"fuse_wu": "wu"}, _ALL),
    # several V tiles per fused state program (W recomputed by each)
    "fuse_wu_bv16": ({"fuse_wu": "wu", "state_fused": (4, 3, 16), "state_bwd_fused": (4, 3, 16)},
                     lambda C, K, V: V > 16),
    "fuse_assoc_bv16": ({"fuse_wu": "assoc", "state_fused": (4, 3, 16), "state_bwd_fused": (4, 3, 16)},
                        lambda C, K, V: V > 16),
    "stored_wu_inv_batched": ({"fuse_wu": False}, _C64),
    "assoc_inv_serial": ({"fuse_wu": "assoc", "inv_batched": False}, _C64),
    "wu_no_split": ({"fuse_wu": "wu", "wy_split": False}, _C64),     # wy_fwd with STORE_WU off
    "recompute_states": ({"save_states": False}, _ALL),               # backward recomputes hs, Vn
    # dqkwg_bwd in one K slice on 8 warps (the default until 2026-12-03: two slices, partial dG
    # summed, on 4 warps; capped at one where K = 16)
    "dqkwg_k1": ({"dqkwg_ksplit": 1, "dqkwg": (8, 3, 32)}, lambda C, K, V: K > 16),
    # its K slices on a third grid axis (the default since 2026-12-03's sixtieth session puts the
    # slices of a chunk next to each other in launch order: grid (NC·ks, H))
    "dqkwg_third_axis": ({"dqkwg_slices_adjacent": False}, lambda C, K, V: K > 16),
    # the "assoc" backward in its first order (the lean order, Q and dO loaded late and dots
    # accumulated into the state, is the default since 2026-11-25: 0.87-0.91x fwd+bwd on an H100)
    "assoc_not_lean": ({"state_bwd_lean": False, "state_bwd_fused": (4, 3, 64)}, _ALL),
    "assoc_lean_bv16": ({"state_bwd_lean": True, "state_bwd_fused": (4, 3, 16)}, lambda C, K, V: V > 16),
    # the WY backward through dA = dW (βγK)^T + dU (βV)^T and A^T dA A^T (wy_bwd.py; the default
    # since the sixty-first session takes E from A^T dVn and Vn: wy_bwd_vn.py), in its layouts
    "wy_bwd_dA": ({"wy_bwd_vn": False}, _ALL),
    # its key side unsplit (it splits it in 4 K slices, capped at BK // 16) and in two
    "wy_bwd_k1": ({"wy_bwd_vn": False, "wy_bwd_ksplit": 1, "wy_bwd": (8, 1, 64)}, _ALL),
    "wy_bwd_k2": ({"wy_bwd_vn": False, "wy_bwd_ksplit": 2}, lambda C, K, V: K > 16),
    # wy_bwd_vn_kernel's key side unsplit (default 2 slices), and in 4 with its V tile at 16 columns
    "wy_bwd_vn_k1": ({"wy_bwd_vn_ksplit": 1}, _ALL),
    "wy_bwd_vn_k4_bv16": ({"wy_bwd_vn_ksplit": 4, "wy_bwd_vn_cfg": (4, 2, 16)},
                          lambda C, K, V: K > 16 or V > 16),
    # dqkwg_bwd doing wy_bwd_vn_kernel's work (FUSE_WY, opt-in), in 2 and 4 K slices (capped at BK //
    # 16) and in one
    "dqkwg_fuse_wy": ({"dqkwg_fuse_wy": True}, _ALL),
    "dqkwg_fuse_wy_k4": ({"dqkwg_fuse_wy": True, "dqkwg_ksplit": 4}, lambda C, K, V: K > 32),
    "dqkwg_fuse_wy_dg_z": ({"dqkwg_fuse_wy": True, "dqkwg_dg_grads": False}, _ALL),
    # the lean backward step loading its key tile again for the second dot (fewer sm_90a spills):
    # the default reloads it without the gate only ("ungated"); these rows take it always / never
    "bwd_reload_k": ({"state_bwd_reload_k": True}, _ALL),
    "bwd_no_reload_k": ({"state_bwd_reload_k": False}, _ALL),
    # the gated dqkwg_bwd's gate term as rowsum(Z) - colsum(Z) + ... (the default reads it off its
    # own dq, dk tiles since 2026-11-26), one K slice and two
    "dqkwg_dg_z": ({"dqkwg_dg_grads": False}, _ALL),
    "dqkwg_k1_dg_z": ({"dqkwg_ksplit": 1, "dqkwg_dg_grads": False}, lambda C, K, V: K > 16),
    # the sliced wy_bwd storing dbeta and dg before its second pass (needs K slices: K > 16)
    "wy_bwd_early_db": ({"wy_bwd_vn": False, "wy_bwd_early_db": True}, lambda C, K, V: K > 16),
    # dv_local over its V tile 16 columns a step, and in one pass (the default: 32 a step, so one
    # pass where V <= 32)
    "dv_local_bvl16": ({"dv_local_bvl": 16}, lambda C, K, V: V > 16),
    "dv_local_one_pass": ({"dv_local_bvl": None}, lambda C, K, V: V > 32),
    # the TMA stores (state_bwd_fused's dH', state_fwd_fused's states; the interpreter runs them
    # too): the defaults take dH' gated and H wherever Vn is not; these rows take them always, and
    # no_tma none (the plain stores)
    "state_bwd_tma_dh": ({"state_bwd_tma_dh": True}, _ALL),
    "state_fwd_tma_hs": ({"state_fwd_tma_hs": True, "state_fwd_tma_vn": False}, _ALL),
    "no_tma": ({"state_bwd_tma_dh": False, "state_fwd_tma_hs": False, "state_fwd_tma_vn": False,
                "state_bwd_tma_x": False}, _ALL),
    # the state backward forming P^T dO itself (no dv_local launch), with the WY backward in both forms
    "state_bwd_local_dv": ({"state_bwd_local_dv": True}, _ALL),
    "state_bwd_local_dv_dA": ({"state_bwd_local_dv": True, "wy_bwd_vn": False}, _ALL),
    # ... and the per-sub-step rows Vn and A^T dVn, where every chunk is full (else the plain store)
    "state_tma_rows": ({"state_fwd_tma_vn": True, "state_bwd_tma_x": True, "state_bwd_tma_dh": True},
                       _ALL),
    "tma_dk": ({"dqkwg_tma_dk": True}, _ALL),                    # dqkwg_bwd's dk tile, the same way
    "tma_dk_fuse_wy": ({"dqkwg_tma_dk": True, "dqkwg_fuse_wy": True}, _ALL),
}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("LRNN_SCAN_POISON", "1")


def _tune(monkeypatch, variant):
    from lrnn_scan.kernels.delta_product import function as fn
    for key, val in VARIANTS[variant][0].items():
        monkeypatch.setitem(fn.TUNE, key, val)       # restored after the test


CASES = [  # (T, chunk, n_h, gated, beta_max, cu, K, V)
    (1, 16, 2, True, 2.0, None, 16, 16),
    (37, 16, 1, False, 1.0, None, 16, 64),            # V spans two backward V tiles
    (37, 16, 3, True, 2.0, None, 16, 16),
    (20, 16, 4, False, 2.0, None, 32, 16),
    (30, 16, 2, True, 2.0, [0, 7, 7, 19, 30], 16, 16),
    (130, 64, 1, True, 2.0, None, 16, 16),
    (50, 64, 3, True, 2.0, [0, 3, 50], 16, 16),          # blocked 64x64 inverse, varlen
    (45, 64, 2, False, 2.0, None, 16, 16),
    (21, 32, 3, True, 1.0, [0, 1, 21], 20, 12),       # K, V not powers of two (masked tiles)
    (40, 16, 2, True, 2.0, [0, 9, 40], 48, 64),       # 2 or 4 K slices (one all masked), 2 V tiles
]


@pytest.mark.parametrize("T,C,n_h,gated,bmax,cu,K,V,variant",
                         [c + (v,) for c in CASES for v in VARIANTS if VARIANTS[v][1](c[1], c[6], c[7])])
def test_triton_interpreter_matches_loop(T, C, n_h, gated, bmax, cu, K, V, variant, monkeypatch):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported without the interpreter")
    _tune(monkeypatch, variant)
    B, H = (1 if cu else (1 if C == 64 else 2)), (1 if C == 64 else 2)
    N = len(cu) - 1 if cu else B
    q, k, v, beta, g, h0 = make_inputs(B, T, n_h, H, K, V, gated, bmax, N=N, seed=T * 7 + n_h,
                                       dtype=torch.float32)
    cus = torch.tensor(cu, dtype=torch.int64) if cu else None
    xs = [x.requires_grad_() for x in (q, k, v, beta, g, h0) if x is not None]
    o, f = chunk_delta_product(q, k, v, beta, g, initial_state=h0, output_final_state=True,
                               cu_seqlens=cus, chunk_size=C, backend="triton")
    gen = torch.Generator().manual_seed(2)
    do, dh = torch.randn(o.shape, generator=gen), torch.randn(f.shape, generator=gen)
    grads = torch.autograd.grad((o * do).sum() + (f * dh).sum(), xs)
    xd = [x.detach().double().requires_grad_() for x in xs]
    it = iter(xd)
    qd, kd, vd, bd = (next(it) for _ in range(4))
    gd = next(it) if gated else None
    h0d = next(it)
    o_r, f_r = loop_fp64(qd, kd, vd, bd, gd, h0d, K ** -0.5, cu)
    grads_r = torch.autograd.grad((o_r * do.double()).sum() + (f_r * dh.double()).sum(), xd)
    names = ["q", "k", "v", "beta"] + (["g"] if gated else []) + ["h0"]
    errs = {}
    for name, a, b in [("o", o, o_r), ("final", f, f_r)] + list(zip(names, grads, grads_r)):
        assert torch.isfinite(a).all(), name
        errs[name] = ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()
    print(f"[{variant}] T={T} C={C} n_h={n_h} gated={gated} worst {max(errs.values()):.2e} "
          f"({max(errs, key=errs.get)})")
    for name, err in errs.items():
        assert err < 2e-5, (name, err)


@pytest.mark.parametrize("case", [(100, 64, 2, True, 2.0, [0, 37, 100], 40, 16),
                                  (70, 64, 1, False, 2.0, None, 32, 16)])
def test_tri_inv64_key_widths_match_loop(case, monkeypatch):
    """tri_inv64 (chunk 64) at K = 40 (a key block with masked columns) and K = 32, varlen with a
    boundary inside the first chunk, against the fp64 loop."""
    test_triton_interpreter_matches_loop(*case, "default", monkeypatch)


def test_maxnreg_caps_reach_the_launches_and_bad_caps_are_refused(monkeypatch):
    """TUNE["maxnreg"] (register caps of tri_inv64, wy_bwd, wy_bwd_vn, the state kernels and the
    token-chunk output kernel, GPU-only: the interpreter drops the option): a capped fwd+bwd still
    matches the uncapped one, a ":gated" / ":ungated" key overrides the launch's plain one for that
    case, and a cap outside [24, 255], an unknown launch name or a non-dict is refused with the key
    named."""
    from lrnn_scan.kernels.delta_product import function as fn

    q, k, v, beta, g, _ = make_inputs(1, 70, 1, 1, 16, 16, True, 2.0, dtype=torch.float32)
    xs = [x.requires_grad_() for x in (q, k, v, beta, g)]
    ref = chunk_delta_product(q, k, v, beta, g, chunk_size=64, backend="triton")[0]
    ref_g = torch.autograd.grad(ref.sum(), xs)
    monkeypatch.setitem(fn.TUNE, "maxnreg", {"inv": 128, "wy_bwd": 168, "output_tok": 160,
                                             "state_bwd_fused": 128, "wy_bwd_vn": 168,
                                             "wy_bwd_vn:ungated": 160, "dqkwg:gated": 200})
    assert fn._regs("inv", True) == {"maxnreg": 128} and fn._regs("output_tok", False) == {"maxnreg": 160}
    assert fn._regs("state_fused", True) == {}
    # a ":gated" / ":ungated" key takes precedence over the plain name for its case only
    assert fn._regs("wy_bwd_vn", False) == {"maxnreg": 160} and fn._regs("wy_bwd_vn", True) == {"maxnreg": 168}
    assert fn._regs("dqkwg", True) == {"maxnreg": 200} and fn._regs("dqkwg", False) == {}
    o = chunk_delta_product(q, k, v, beta, g, chunk_size=64, backend="triton")[0]
    torch.testing.assert_close(o, ref)
    for a, b in zip(torch.autograd.grad(o.sum(), xs), ref_g):
        torch.testing.assert_close(a, b)
    q2, k2, v2, b2, g2, _ = make_inputs(1, 70, 2, 1, 16, 16, True, 2.0, dtype=torch.float32)
    with torch.no_grad():  # n_h = 2 without gradients: the token-chunk output kernel, capped
        o2 = chunk_delta_product(q2, k2, v2, b2, g2, chunk_size=64, backend="triton")[0]
        monkeypatch.setitem(fn.TUNE, "maxnreg", {})
        torch.testing.assert_close(o2, chunk_delta_product(q2, k2, v2, b2, g2, chunk_size=64, backend="triton")[0])
    for bad in ({"inv": 300}, {"wy_bwd": 16}, {"inv": 128.0}, {"inv": True}, [("inv", 128)],
                {"wy_bwd_vm": 168}, {"dqkwg:gate": 168}, {3: 168}):
        monkeypatch.setitem(fn.TUNE, "maxnreg", bad)
        with pytest.raises(ValueError, match="maxnreg"):
            chunk_delta_product(q, k, v, beta, g, chunk_size=64, backend="triton")[0].sum().backward()


def test_fp32_dot_precision_setting(monkeypatch):
    """TUNE["fp32_dot"]: the dots' precision for float32 inputs with TF32 off ("tf32x3", the
    default, or "ieee"; 16-bit inputs and TF32-allowed float32 take "tf32"); a bad value is refused
    with the key named. The interpreter's dots ignore the precision, so the ieee run must match the
    fp64 loop as tightly as the default (their GPU accuracy: tests/gpu/test_gpu_delta.py)."""
    from lrnn_scan.kernels.delta_product import function as fn
    q16 = torch.zeros(1, 4, 1, 16, dtype=torch.bfloat16)
    q32 = q16.float()
    assert fn._cfg(q32, q32, q32, 64)[4] == "tf32x3" and fn._cfg(q16, q16, q16, 64)[4] == "tf32"
    monkeypatch.setitem(fn.TUNE, "fp32_dot", "ieee")
    assert fn._cfg(q32, q32, q32, 64)[4] == "ieee" and fn._cfg(q16, q16, q16, 64)[4] == "tf32"
    saved = torch.backends.cuda.matmul.allow_tf32   # by hand: see test_float32_dots_follow_torch_tf32_switch
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert fn._cfg(q32, q32, q32, 64)[4] == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    test_triton_interpreter_matches_loop(30, 16, 2, True, 2.0, [0, 7, 7, 19, 30], 16, 16, "default",
                                         monkeypatch)
    monkeypatch.setitem(fn.TUNE, "fp32_dot", "tf32")
    with pytest.raises(ValueError, match="fp32_dot"):
        fn._cfg(q32, q32, q32, 64)


@pytest.mark.parametrize("variant", ["default", "stored_wu", "fuse_wu"])
def test_triton_no_grad_and_no_final_state(variant, monkeypatch):
    _tune(monkeypatch, variant)
    q, k, v, beta, g, _ = make_inputs(2, 9, 2, 1, 16, 16, True, 2.0, dtype=torch.float32)
    o, f = chunk_delta_product(q, k, v, beta, g, chunk_size=16, backend="triton")
    assert f is None
    o_r, _ = loop_fp64(q.double(), k.double(), v.double(), beta.double(), g.double(),
                       torch.zeros(2, 1, 16, 16, dtype=torch.float64), 0.25)
    assert ((o.double() - o_r).norm() / o_r.norm()).item() < 2e-5


TOKEN_CASES = [  # (T, n_h, gated, cu, K, V): chunk 64; token chunks of 1-4 chunks, sequences that
    # end inside a token chunk and inside a chunk, an empty one, K, V not powers of two
    (70, 2, True, None, 16, 16),
    (50, 3, True, [0, 3, 3, 50], 20, 12),
    (90, 4, False, [0, 17, 90], 16, 16),
    (140, 2, True, [0, 64, 65, 140], 16, 16),
]


def _spy_token_output(fn, monkeypatch):
    """The grids of ``fn.output_tok_fwd_kernel``'s launches, recorded as they run."""
    launched, real = [], fn.output_tok_fwd_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]
    monkeypatch.setattr(fn, "output_tok_fwd_kernel", Spy())
    return launched


def _token_chunk_count(T, cu):
    """Token chunks of 64 tokens over the sequences (one output program each, per V tile and head)."""
    lens = [b - a for a, b in zip(cu[:-1], cu[1:])] if cu else [T]
    return sum(-(-n // 64) for n in lens)


@pytest.mark.parametrize("pred", [False, True])      # TUNE["token_state_pred"]: predicated store
@pytest.mark.parametrize("T,n_h,gated,cu,K,V", TOKEN_CASES)
def test_token_chunk_output_forward_matches_loop(T, n_h, gated, cu, K, V, pred, monkeypatch):
    """TUNE["token_chunk_output"]: without gradients the forward keeps one state per 64 tokens and
    runs output_tok_fwd_kernel; outputs and final states against the fp64 loop, and the launch
    really took that path (the state buffer has one entry per token chunk)."""
    from lrnn_scan.kernels.delta_product import function as fn
    monkeypatch.setitem(fn.TUNE, "token_chunk_output", True)
    monkeypatch.setitem(fn.TUNE, "token_state_pred", pred)
    launched = _spy_token_output(fn, monkeypatch)
    N = len(cu) - 1 if cu else 1
    q, k, v, beta, g, h0 = make_inputs(1, T, n_h, 2, K, V, gated, 2.0, N=N, seed=T + n_h,
                                       dtype=torch.float32)
    cus = torch.tensor(cu, dtype=torch.int64) if cu else None
    o, f = chunk_delta_product(q, k, v, beta, g, initial_state=h0, output_final_state=True,
                               cu_seqlens=cus, chunk_size=64, backend="triton")
    assert launched and launched[0][1] == _token_chunk_count(T, cu)
    o_r, f_r = loop_fp64(q.double(), k.double(), v.double(), beta.double(),
                         g.double() if gated else None, h0.double(), K ** -0.5, cu)
    for name, a, b in (("o", o, o_r), ("final", f, f_r)):
        assert torch.isfinite(a).all(), name
        assert ((a.double() - b).norm() / b.norm()).item() < 2e-5, name


@pytest.mark.parametrize("T,n_h,gated,cu,K,V", TOKEN_CASES)
def test_token_chunk_output_with_gradients_matches_loop(T, n_h, gated, cu, K, V, monkeypatch):
    """TUNE["token_chunk_output_grad"]: a forward with gradients keeps one state per chunk (the
    backward reads them) and output_tok_fwd_kernel reads each token chunk's first one (HS_CHUNK);
    outputs, final states and every gradient against the fp64 loop, and the launch took that path."""
    from lrnn_scan.kernels.delta_product import function as fn
    monkeypatch.setitem(fn.TUNE, "token_chunk_output_grad", True)
    launched = _spy_token_output(fn, monkeypatch)
    monkeypatch.setattr(fn, "output_fwd_kernel", None)      # the per-chunk launch would raise
    N = len(cu) - 1 if cu else 1
    q, k, v, beta, g, h0 = make_inputs(1, T, n_h, 2, K, V, gated, 2.0, N=N, seed=T + 3 * n_h,
                                       dtype=torch.float32)
    cus = torch.tensor(cu, dtype=torch.int64) if cu else None
    xs = [x.requires_grad_() for x in (q, k, v, beta, g, h0) if x is not None]
    o, f = chunk_delta_product(q, k, v, beta, g, initial_state=h0, output_final_state=True,
                               cu_seqlens=cus, chunk_size=64, backend="triton")
    assert launched and launched[0][1] == _token_chunk_count(T, cu)
    gen = torch.Generator().manual_seed(5)
    do, dh = torch.randn(o.shape, generator=gen), torch.randn(f.shape, generator=gen)
    grads = torch.autograd.grad((o * do).sum() + (f * dh).sum(), xs)
    xd = [x.detach().double().requires_grad_() for x in xs]
    qd, kd, vd, bd = xd[:4]
    gd = xd[4] if gated else None
    o_r, f_r = loop_fp64(qd, kd, vd, bd, gd, xd[-1], K ** -0.5, cu)
    grads_r = torch.autograd.grad((o_r * do.double()).sum() + (f_r * dh.double()).sum(), xd)
    names = ["o", "final", "q", "k", "v", "beta"] + (["g"] if gated else []) + ["h0"]
    for name, a, b in zip(names, (o, f) + tuple(grads), (o_r, f_r) + tuple(grads_r)):
        assert torch.isfinite(a).all(), name
        assert ((a.double() - b).norm() / b.norm()).item() < 2e-5, name


@pytest.mark.parametrize("B,T,n_h", [(1, 70, 2), (3, 50, 3), (2, 1, 4), (2, 64, 2), (1, 300, 4)])
def test_token_chunk_tables_equal_lengths_match_varlen(B, T, n_h):
    """The closed form for equal lengths (no device-to-host copy) gives the varlen tables."""
    from lrnn_scan.kernels.delta_product.chunks import build_chunks, build_token_chunks
    a = build_token_chunks(build_chunks(B, T, n_h, 64, None, "cpu"), n_h, "cpu")
    cu = torch.arange(B + 1, dtype=torch.int64) * T
    b = build_token_chunks(build_chunks(B, T, n_h, 64, cu, "cpu"), n_h, "cpu")
    assert a["NT"] == b["NT"]
    for key in ("first", "count", "seq_ptr"):
        assert torch.equal(a[key], b[key]), key


def test_token_chunk_output_not_taken_with_gradients(monkeypatch):
    """With inputs that need gradients the backward reads every chunk's state: the per-chunk path."""
    from lrnn_scan.kernels.delta_product import function as fn
    monkeypatch.setitem(fn.TUNE, "token_chunk_output", True)
    monkeypatch.setitem(fn.TUNE, "token_chunk_output_grad", False)
    monkeypatch.setattr(fn, "output_tok_fwd_kernel", None)     # a launch would raise TypeError
    q, k, v, beta, g, _ = make_inputs(1, 40, 2, 1, 16, 16, True, 2.0, dtype=torch.float32)
    q.requires_grad_()
    o, _ = chunk_delta_product(q, k, v, beta, g, chunk_size=64, backend="triton")
    o.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_triton_rejects_bad_chunk():
    q, k, v, beta, g, _ = make_inputs(1, 4, 1, 1, 16, 16, False, 1.0, dtype=torch.float32)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_delta_product(q, k, v, beta, chunk_size=24, backend="triton")


def test_triton_l2norm_and_scale_match_torch_backend():
    q, k, v, beta, g, h0 = make_inputs(1, 19, 2, 2, 16, 16, True, 2.0, dtype=torch.float32)
    kw = dict(scale=0.3, initial_state=h0, output_final_state=True, use_qk_l2norm=True, chunk_size=16)
    o_t, f_t = chunk_delta_product(q * 2, k * 3, v, beta, g, backend="triton", **kw)
    o_r, f_r = chunk_delta_product((q * 2).double(), (k * 3).double(), v.double(), beta.double(), g.double(),
                                   **{**kw, "initial_state": h0.double()}, backend="torch")
    assert ((o_t.double() - o_r).norm() / o_r.norm()).item() < 2e-5
    assert ((f_t.double() - f_r).norm() / f_r.norm()).item() < 2e-5


@pytest.mark.parametrize("allow_tf32,expect", [(False, "tf32x3"), (True, "tf32")])
def test_float32_dots_follow_torch_tf32_switch(allow_tf32, expect):
    """fp32 inputs: fp32-accurate dots (TUNE["fp32_dot"], default three tf32 products) unless TF32
    matmuls are allowed; 16-bit inputs always tf32."""
    from lrnn_scan.kernels.delta_product import function as fn
    # saved and restored by hand: allow_tf32 is a property of torch's cuBLAS module object, which
    # pytest 9.2's monkeypatch could not undo (it tried delattr; 9.0 could)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        q = torch.randn(1, 64, 1, 16)
        k, v = torch.randn(1, 64, 1, 1, 16), torch.randn(1, 64, 1, 1, 16)
        assert fn._cfg(q, k, v, 64)[-1] == expect
        assert fn._cfg(q.bfloat16(), k.bfloat16(), v.bfloat16(), 64)[-1] == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


class _Boom:
    def __getitem__(self, grid):
        raise AssertionError("wu_fwd_kernel launched under fuse_wu")


def test_fused_variant_skips_wu_and_backward_follows_forward(monkeypatch):
    """``fuse_wu``: no W/U kernel, nothing of size W/U saved; the backward uses the forward's choice
    even if TUNE changes in between; a bad value is refused."""
    from lrnn_scan.kernels.delta_product import function as fn

    monkeypatch.setattr(fn, "wu_fwd_kernel", _Boom())
    monkeypatch.setitem(fn.TUNE, "fuse_wu", "assoc")
    q, k, v, beta, g, h0 = make_inputs(1, 70, 1, 1, 16, 16, True, 2.0, dtype=torch.float32)
    xs = [x.requires_grad_() for x in (q, k, v, beta, g, h0)]
    o, f = chunk_delta_product(*xs[:5], initial_state=xs[5], output_final_state=True, chunk_size=64,
                               backend="triton")
    assert o.grad_fn.saved_tensors[8:10] == (None, None)  # W, U not saved
    monkeypatch.setitem(fn.TUNE, "fuse_wu", False)       # and the backward must not look for them
    grads = torch.autograd.grad(o.sum() + f.sum(), xs)
    xd = [x.detach().double().requires_grad_() for x in xs]
    o_r, f_r = loop_fp64(*xd, 16 ** -0.5)
    grads_r = torch.autograd.grad(o_r.sum() + f_r.sum(), xd)
    for a, b in zip((o, f) + grads, (o_r, f_r) + grads_r):
        assert ((a.double() - b).norm() / b.norm()).item() < 2e-5
    monkeypatch.setitem(fn.TUNE, "fuse_wu", "yes")
    with pytest.raises(ValueError, match="fuse_wu"):
        chunk_delta_product(q, k, v, beta, g, chunk_size=64, backend="triton")


@pytest.mark.parametrize("key,vn,fuse", [("dqkwg_ksplit", True, False), ("dqkwg_ksplit", True, True),
                                         ("wy_bwd_vn_ksplit", True, False), ("wy_bwd_ksplit", False, False)])
def test_ksplit_bad_value_is_refused(key, vn, fuse, monkeypatch):
    from lrnn_scan.kernels.delta_product import function as fn

    q, k, v, beta, g, _ = make_inputs(1, 5, 1, 1, 32, 16, True, 2.0, dtype=torch.float32)
    xs = [x.requires_grad_() for x in (q, k, v, beta, g)]
    o, _ = chunk_delta_product(*xs, chunk_size=16, backend="triton")
    monkeypatch.setitem(fn.TUNE, "wy_bwd_vn", vn)      # wy_bwd_ksplit: the dA form's launch
    monkeypatch.setitem(fn.TUNE, "dqkwg_fuse_wy", fuse)  # wy_bwd_vn_ksplit: its own launch
    monkeypatch.setitem(fn.TUNE, key, 3)
    with pytest.raises(ValueError, match=key):
        o.sum().backward()


@pytest.mark.parametrize("bad", [8, 48, True, "32"])
def test_dv_local_bvl_bad_value_is_refused(bad, monkeypatch):
    from lrnn_scan.kernels.delta_product import function as fn

    q, k, v, beta, g, _ = make_inputs(1, 5, 1, 1, 16, 32, True, 2.0, dtype=torch.float32)
    xs = [x.requires_grad_() for x in (q, k, v, beta, g)]
    o, _ = chunk_delta_product(*xs, chunk_size=16, backend="triton")
    monkeypatch.setitem(fn.TUNE, "dv_local_bvl", bad)
    with pytest.raises(ValueError, match="dv_local_bvl"):
        o.sum().backward()


def test_state_bwd_reload_k_bad_value_is_refused(monkeypatch):
    from lrnn_scan.kernels.delta_product import function as fn

    q, k, v, beta, g, _ = make_inputs(1, 5, 1, 1, 16, 16, False, 2.0, dtype=torch.float32)
    xs = [x.requires_grad_() for x in (q, k, v, beta)]
    o, _ = chunk_delta_product(*xs, None, chunk_size=16, backend="triton")
    monkeypatch.setitem(fn.TUNE, "state_bwd_reload_k", "always")
    with pytest.raises(ValueError, match="state_bwd_reload_k"):
        o.sum().backward()


@pytest.mark.parametrize("key", ["state_bwd_tma_dh", "state_fwd_tma_hs", "state_fwd_tma_vn",
                                 "state_bwd_tma_x", "dqkwg_tma_dk"])
def test_tma_switch_bad_value_is_refused(key, monkeypatch):
    """The TMA store switches take True, False, "gated" or "ungated"; anything else is refused
    with the key named before any launch."""
    from lrnn_scan.kernels.delta_product import function as fn

    q, k, v, beta, g, _ = make_inputs(1, 32, 1, 1, 16, 16, True, 2.0, dtype=torch.float32)
    xs = [x.requires_grad_() for x in (q, k, v, beta, g)]
    monkeypatch.setitem(fn.TUNE, key, "yes")
    with pytest.raises(ValueError, match=key):
        chunk_delta_product(*xs, chunk_size=16, backend="triton")[0].sum().backward()


class _Counting:
    """Wraps a kernel: counts launches, then launches it."""
    def __init__(self, kern):
        self.kern, self.n = kern, 0

    def __getitem__(self, grid):
        self.n += 1
        return self.kern[grid]


@pytest.mark.parametrize("fuse", ["assoc", False])
def test_save_states_skips_the_recompute_with_identical_gradients(fuse, monkeypatch):
    """``save_states``: the backward reuses the forward's chunk-start states and Vn (one state-kernel
    launch per forward+backward instead of two; varlen, gated, h0) and every output and gradient
    is bit-identical to the recomputing default."""
    from lrnn_scan.kernels.delta_product import function as fn
    monkeypatch.setitem(fn.TUNE, "fuse_wu", fuse)
    name = "state_fwd_fused_kernel" if fuse else "state_fwd_kernel"
    cnt = _Counting(getattr(fn, name))
    monkeypatch.setattr(fn, name, cnt)
    q, k, v, beta, g, h0 = make_inputs(1, 45, 2, 2, 16, 16, True, 2.0, N=3, seed=11, dtype=torch.float32)
    cu = torch.tensor([0, 10, 10, 45])
    runs = {}
    for keep in (False, True):
        monkeypatch.setitem(fn.TUNE, "save_states", keep)
        cnt.n = 0
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v, beta, g, h0)]
        o, f = chunk_delta_product(*xs[:5], initial_state=xs[5], output_final_state=True,
                                   cu_seqlens=cu, chunk_size=16, backend="triton")
        kept = o.grad_fn.saved_tensors[10:]
        assert all((x is not None) == keep for x in kept), keep
        grads = torch.autograd.grad((o * 1.5).sum() + (f * 0.5).sum(), xs)
        runs[keep] = (cnt.n, [o, f, *grads])
    assert (runs[False][0], runs[True][0]) == (2, 1)
    for a, b in zip(runs[False][1], runs[True][1]):
        assert torch.equal(a, b)


def _bf16_errors(n_h, gated):
    """Relative errors of every output and gradient, bf16 inputs (rounded values as the fp64 reference)."""
    q, k, v, beta, g, h0 = make_inputs(1, 70, n_h, 1, 32, 32, gated, 2.0, dtype=torch.float32, seed=5)
    lo = [x.bfloat16() if x is not None else None for x in (q, k, v, beta, g)] + [h0 * 0.1]
    xs = [x.requires_grad_() for x in lo if x is not None]
    o, f = chunk_delta_product(*lo[:5], initial_state=lo[5], output_final_state=True, chunk_size=64,
                               backend="triton")
    gen = torch.Generator().manual_seed(3)
    do, dh = torch.randn(o.shape, generator=gen, dtype=torch.float64), torch.randn(f.shape, generator=gen,
                                                                                    dtype=torch.float64)
    grads = torch.autograd.grad((o.double() * do).sum() + (f.double() * dh).sum(), xs)
    xd = [x.detach().double().requires_grad_() for x in xs]
    it = iter(xd)
    qd, kd, vd, bd = (next(it) for _ in range(4))
    gd = next(it) if gated else None
    o_r, f_r = loop_fp64(qd, kd, vd, bd, gd, next(it), 32 ** -0.5)
    grads_r = torch.autograd.grad((o_r * do).sum() + (f_r * dh).sum(), xd)
    return [((a.double() - b).norm() / b.norm()).item() for a, b in zip((o, f) + grads, (o_r, f_r) + grads_r)]


@pytest.mark.parametrize("n_h,T", [(1, 70), (3, 70), (1, 64), (3, 64)])
def test_vn_16bit_only_without_gradients(n_h, T, monkeypatch):
    """TUNE["vn_16bit"] == "no_grad" (the default): bf16 inputs keep Vn in bf16 when no backward
    reads it, in fp32 when one does; with True it is bf16 either way, with False fp32. The forward
    without gradients still matches the fp64 loop (interpreter bound, see below). At T = 64 every
    chunk is full, so the gated default stores Vn by TMA (``TUNE["state_fwd_tma_vn"]``), in bf16
    or fp32 as above."""
    from lrnn_scan.kernels.delta_product import function as fn
    seen, tma = [], []
    real, real_rows = fn._state_fwd, fn._rows_desc

    def spy(*a, **kw):
        out = real(*a, **kw)
        seen.append(out[1].dtype)
        return out

    def spy_rows(*a):
        out = real_rows(*a)
        if a[1] == "state_fwd_tma_vn":
            tma.append(bool(out))
        return out
    monkeypatch.setattr(fn, "_state_fwd", spy)
    monkeypatch.setattr(fn, "_rows_desc", spy_rows)
    q, k, v, beta, g, h0 = make_inputs(1, T, n_h, 1, 32, 32, True, 2.0, dtype=torch.float32, seed=7)
    lo = [x.bfloat16() for x in (q, k, v, beta, g)]
    for setting, grad, want in (("no_grad", False, torch.bfloat16), ("no_grad", True, torch.float32),
                                (True, True, torch.bfloat16), (False, False, torch.float32)):
        monkeypatch.setitem(fn.TUNE, "vn_16bit", setting)
        xs = [x.detach().requires_grad_(grad) for x in lo]
        seen.clear()
        o, _ = chunk_delta_product(*xs, chunk_size=64, backend="triton")
        assert seen == [want], (setting, grad, seen)
        assert tma[-1] == (T == 64), tma
        if not grad:
            o_r, _ = loop_fp64(*(x.double() for x in lo), torch.zeros(1, 1, 32, 32, dtype=torch.float64),
                               32 ** -0.5)
            err = ((o.double() - o_r).norm() / o_r.norm()).item()
            assert err < 2e-2, (setting, err)


@pytest.mark.parametrize("over", [{"fuse_wu": "wu"}, {"fuse_wu": "assoc", "inv_batched": True},
                                  {"a_16bit": True}, {"fuse_wu": "assoc", "a_16bit": True},
                                  {"dhs_16bit": True}])
def test_bf16_inputs_variants_as_exact_as_default(over, monkeypatch):
    """bf16 inputs (fp32 inputs never take a 16-bit A): each opt-in variant within 10 % (+2e-4) of the
    default path's error on every output and gradient. The GPU bound is 5e-3 at full size; the
    interpreter has no tf32 (the fp32 final state is exact to 1e-7 here, fp16 A alone gives 1e-4) and
    truncates fp32 -> bf16 casts, so only the comparison is checked here."""
    from lrnn_scan.kernels.delta_product import function as fn
    base = _bf16_errors(2, True)
    for key, val in over.items():
        monkeypatch.setitem(fn.TUNE, key, val)
    var = _bf16_errors(2, True)
    assert all(e < 2e-2 for e in base), base
    for b, e in zip(base, var):
        assert e == e and e <= 1.1 * b + 2e-4, (base, var)


def test_custom_op_path_ignores_fused_switches(monkeypatch):
    """lrnn_scan.compile's custom op returns W, U and an fp32 A (its schema): with the opt-in
    switches set it keeps the stored-W/U path and still matches the Function, gradients included."""
    import lrnn_scan.compile as lc
    from lrnn_scan.kernels.delta_product import chunk_delta_product_triton
    from lrnn_scan.kernels.delta_product import function as fn

    def run(f):
        xs = [x.detach().clone().requires_grad_() for x in make_inputs(1, 40, 2, 1, 16, 16, True, 2.0,
                                                                          dtype=torch.float32)]
        o, hT = f(*xs[:5], None, xs[5], True, None, 16)
        return [o, hT] + list(torch.autograd.grad(o.sum() + hT.sum(), xs))

    ref = run(chunk_delta_product_triton)
    monkeypatch.setitem(fn.TUNE, "fuse_wu", "assoc")
    monkeypatch.setitem(fn.TUNE, "a_16bit", True)
    for a, b in zip(run(lc.chunk_delta_product_triton), ref):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_state_tma_descriptor_where_tma_can_store(monkeypatch):
    """``TUNE["state_bwd_tma_dh"]`` / ``["state_fwd_tma_hs"]`` hand the state kernels a TMA
    descriptor over ``[n·H, K, V]`` (blocks ``[1, BK, BV]``) where the rows are 16-byte multiples,
    and leave them the plain store otherwise, or when the setting is off (the variant rows above
    run both)."""
    from lrnn_scan.kernels.delta_product import function as fn
    dhs = torch.zeros(3, 2, 20, 12)                      # rows of 12 fp32: 48 bytes
    monkeypatch.setitem(fn.TUNE, "state_bwd_tma_dh", "gated")                   # the default
    assert fn._state_desc(dhs, "state_bwd_tma_dh", False, "dhs_desc", "TMA_DH", 20, 12, 32, 16) == {}
    args = fn._state_desc(dhs, "state_bwd_tma_dh", True, "dhs_desc", "TMA_DH", 20, 12, 32, 16)
    assert args["TMA_DH"] is True
    assert list(args["dhs_desc"].shape) == [6, 20, 12] and list(args["dhs_desc"].block_shape) == [1, 32, 16]
    assert fn._state_desc(torch.zeros(3, 2, 20, 6), "state_bwd_tma_dh", True, "dhs_desc", "TMA_DH",
                          20, 6, 32, 16) == {}                                   # 24-byte rows
    monkeypatch.setitem(fn.TUNE, "state_bwd_tma_dh", False)
    assert fn._state_desc(dhs, "state_bwd_tma_dh", True, "dhs_desc", "TMA_DH", 20, 12, 32, 16) == {}
    monkeypatch.setitem(fn.TUNE, "state_fwd_tma_hs", "ungated")
    hs = torch.zeros(3, 2, 20, 8, dtype=torch.bfloat16)  # rows of 8 bf16: 16 bytes
    assert fn._state_desc(hs, "state_fwd_tma_hs", False, "hs_desc", "TMA_HS", 20, 8, 32, 16)["TMA_HS"] is True
    assert fn._state_desc(hs, "state_fwd_tma_hs", True, "hs_desc", "TMA_HS", 20, 8, 32, 16) == {}


@pytest.mark.parametrize("variant", ["state_tma_rows", "tma_dk"])
@pytest.mark.parametrize("cu", [None, [0, 8, 40]])
def test_tma_rows_on_full_chunks(cu, variant, monkeypatch):
    """The TMA row stores (``Vn`` and ``A^T dVn`` in the state kernels; ``dqkwg_bwd``'s ``dk``
    tile) are taken only where every chunk is full: equal lengths of
    whole chunks, or ``cu_seqlens`` whose sequences all hold whole chunks (here 16 and 64 sub-steps
    at ``C = 16``); the results match the loop as in the main test."""
    from lrnn_scan.kernels.delta_product import function as fn
    taken, real = [], fn._rows_desc

    def spy(*args):
        out = real(*args)
        taken.append(args[1] if out else None)
        return out
    monkeypatch.setattr(fn, "_rows_desc", spy)
    test_triton_interpreter_matches_loop(40, 16, 2, True, 2.0, cu, 16, 16, variant, monkeypatch)
    # Vn and A^T dVn (gated: the defaults take them too), and dk where asked
    assert sorted(filter(None, taken)) == sorted(["state_bwd_tma_x", "state_fwd_tma_vn"] + (
        ["dqkwg_tma_dk"] if variant == "tma_dk" else []))
    assert sorted(filter(None, taken)) == sorted(set(filter(None, taken)))
    taken.clear()
    test_triton_interpreter_matches_loop(30, 16, 2, True, 2.0, [0, 7, 30] if cu else None, 16, 16,
                                         variant, monkeypatch)
    assert taken and not any(taken)         # a sequence ends inside a chunk: the masked stores
