"""Triton DeltaProduct kernels (forward + native backward) under TRITON_INTERPRET=1 on the CPU,
against the fp64 loop: outputs, final states, all gradients (issue 4)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this module

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from lrnn_scan.delta import chunk_delta_product  # noqa: E402
from test_delta_chunk import loop_fp64, make_inputs  # noqa: E402

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
]


@pytest.mark.parametrize("T,C,n_h,gated,bmax,cu,K,V", CASES)
def test_triton_interpreter_matches_loop(T, C, n_h, gated, bmax, cu, K, V):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported without the interpreter")
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
    for name, a, b in [("o", o, o_r), ("final", f, f_r)] + list(zip(names, grads, grads_r)):
        assert torch.isfinite(a).all(), name
        err = ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()
        assert err < 2e-5, (name, err)


def test_triton_no_grad_and_no_final_state():
    q, k, v, beta, g, _ = make_inputs(2, 9, 2, 1, 16, 16, True, 2.0, dtype=torch.float32)
    o, f = chunk_delta_product(q, k, v, beta, g, chunk_size=16, backend="triton")
    assert f is None
    o_r, _ = loop_fp64(q.double(), k.double(), v.double(), beta.double(), g.double(),
                       torch.zeros(2, 1, 16, 16, dtype=torch.float64), 0.25)
    assert ((o.double() - o_r).norm() / o_r.norm()).item() < 2e-5


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


@pytest.mark.parametrize("allow_tf32,expect", [(False, "ieee"), (True, "tf32")])
def test_float32_dots_follow_torch_tf32_switch(allow_tf32, expect, monkeypatch):
    """fp32 inputs: exact dots unless TF32 matmuls are allowed; 16-bit inputs always tf32."""
    from lrnn_scan.kernels.delta_product import function as fn
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", allow_tf32)
    q = torch.randn(1, 64, 1, 16)
    k, v = torch.randn(1, 64, 1, 1, 16), torch.randn(1, 64, 1, 1, 16)
    assert fn._cfg(q, k, v, 64)[-1] == expect
    assert fn._cfg(q.bfloat16(), k.bfloat16(), v.bfloat16(), 64)[-1] == "tf32"
