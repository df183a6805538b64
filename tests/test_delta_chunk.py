"""DeltaProduct chunkwise path (torch backend) vs the generic scan over HouseholderProduct vs an
fp64 token-by-token loop: outputs, final states and all gradients (issue 4)."""
import pytest
import torch
import torch.nn.functional as F

from lrnn_scan.delta import chunk_delta_product, recurrent_delta_product

try:
    from lrnn_scan import HouseholderProduct, scan
except ImportError:  # pragma: no cover - engine not present
    scan = None

DT = torch.float64


def make_inputs(B, T, n_h, H, K, V, gated, beta_max, *, N=None, seed=0, dtype=DT, corr=0.0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    q = r(B, T, H, K)
    k = r(B, T, n_h, H, K)
    if corr:
        k = corr * r(1, 1, 1, H, K) + (1 - corr) * k
    k = F.normalize(k, dim=-1)
    v = r(B, T, n_h, H, V)
    beta = torch.rand(B, T, n_h, H, generator=gen, dtype=dtype) * beta_max
    g = F.logsigmoid(r(B, T, H) + 2.0) if gated else None
    h0 = r(N if N is not None else B, H, K, V)
    return q, k, v, beta, g, h0


def loop_fp64(q, k, v, beta, g, h0, scale, cu=None):
    """Independent token-by-token loop: H ← exp(g) H; H ← H + β k (v − k^T H)^T for each j."""
    B, T, H, K = q.shape
    n_h = k.shape[2]
    offs = [b * T for b in range(B + 1)] if cu is None else cu
    qf, kf, vf, bf = q.reshape(B * T, H, K), k.reshape(B * T, n_h, H, K), \
        v.reshape(B * T, n_h, H, -1), beta.reshape(B * T, n_h, H)
    outs, fins = [], []
    for n in range(len(offs) - 1):
        S = h0[n]
        for t in range(offs[n], offs[n + 1]):
            if g is not None:
                S = S * g.reshape(B * T, H)[t].exp()[:, None, None]
            for j in range(n_h):
                kk = kf[t, j]
                S = S + bf[t, j][:, None, None] * kk[:, :, None] * (vf[t, j] - torch.einsum("hk,hkv->hv", kk, S))[:, None, :]
            outs.append(torch.einsum("hk,hkv->hv", qf[t], S) * scale)
        fins.append(S)
    return torch.stack(outs).reshape(B, T, H, -1), torch.stack(fins)


def via_generic_scan(q, k, v, beta, g, h0, scale, cu=None, method="blelloch"):
    """The same recurrence through ``lrnn_scan.scan(HouseholderProduct(...), B_t)``."""
    keys = k.permute(0, 1, 3, 2, 4)                   # (B, T, H, n_h, K): heads before n_h
    bet = beta.permute(0, 1, 3, 2)                    # (B, T, H, n_h)
    vals = v.permute(0, 1, 3, 2, 4)                   # (B, T, H, n_h, V)
    n_h = keys.shape[3]
    Bt = torch.zeros(*keys.shape[:3], keys.shape[-1], vals.shape[-1], dtype=q.dtype)
    for j in range(n_h):                              # B_t = Σ_j Π_{l>j} P_l β_j k_j v_j^T
        kj = keys[:, :, :, j]
        Bt = Bt - bet[:, :, :, j, None, None] * kj[..., :, None] * torch.einsum("bthk,bthkv->bthv", kj, Bt)[..., None, :]
        Bt = Bt + bet[:, :, :, j, None, None] * kj[..., :, None] * vals[:, :, :, j, None, :]
    op = HouseholderProduct(keys, bet, g.exp() if g is not None else None)
    cus = torch.tensor(cu, dtype=torch.int64) if cu is not None else None
    Hs, fin = scan(op, Bt, initial_state=h0, output_final_state=True, cu_seqlens=cus, method=method)
    o = torch.einsum("bthk,bthkv->bthv", q, Hs) * scale
    return o, fin


def _grads(fn, xs, do, dh):
    xs = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
    o, f = fn(*xs)
    live = [x for x in xs if x is not None]
    gr = torch.autograd.grad((o * do).sum() + (f * dh).sum(), live)
    return o.detach(), f.detach(), gr


def _close(a, b, tol):
    assert torch.isfinite(a).all()
    err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    assert err < tol, err


CASES = [  # (T, chunk, n_h, gated, beta_max, cu)
    (37, 16, 1, False, 1.0, None),
    (37, 16, 2, True, 2.0, None),
    (23, 16, 3, False, 2.0, None),
    (21, 8, 4, True, 1.0, None),
    (30, 16, 2, True, 2.0, [0, 7, 7, 19, 30]),
    (25, 8, 3, False, 2.0, [0, 1, 25]),
    (1, 64, 4, True, 2.0, None),
]


@pytest.mark.parametrize("T,C,n_h,gated,bmax,cu", CASES)
def test_chunk_matches_loop_and_scan(T, C, n_h, gated, bmax, cu):
    B, H, K, V = (1 if cu else 2), 2, 6, 5
    N = len(cu) - 1 if cu else B
    q, k, v, beta, g, h0 = make_inputs(B, T, n_h, H, K, V, gated, bmax, N=N, seed=T + n_h)
    scale = 0.7
    cus = torch.tensor(cu, dtype=torch.int64) if cu else None
    chunk = lambda q, k, v, b, g, h0: chunk_delta_product(q, k, v, b, g, scale=scale, initial_state=h0,
                                                           output_final_state=True, cu_seqlens=cus,
                                                           chunk_size=C, backend="torch")
    ref = lambda q, k, v, b, g, h0: loop_fp64(q, k, v, b, g, h0, scale, cu)
    xs = [q, k, v, beta, g, h0]
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(B, T, H, V, generator=gen, dtype=DT)
    dh = torch.randn(N, H, K, V, generator=gen, dtype=DT)
    o_r, f_r, g_r = _grads(ref, xs, do, dh)
    o_c, f_c, g_c = _grads(chunk, xs, do, dh)
    _close(o_c, o_r, 1e-10)
    _close(f_c, f_r, 1e-10)
    for a, b in zip(g_c, g_r):
        _close(a, b, 1e-9)
    # the package's own reference loop agrees too
    o_p, f_p = recurrent_delta_product(q, k, v, beta, g, scale=scale, initial_state=h0,
                                       output_final_state=True, cu_seqlens=cus)
    _close(o_p, o_r, 1e-12)
    if scan is None:
        pytest.skip("lrnn_scan.scan not available")
    gs = lambda q, k, v, b, g, h0: via_generic_scan(q, k, v, b, g, h0, scale, cu)
    o_s, f_s, g_s = _grads(gs, xs, do, dh)
    _close(o_s, o_r, 1e-10)
    _close(f_s, f_r, 1e-10)
    for a, b in zip(g_s, g_r):
        _close(a, b, 1e-9)


def test_generic_scan_sequential_method_agrees():
    if scan is None:
        pytest.skip("lrnn_scan.scan not available")
    q, k, v, beta, g, h0 = make_inputs(2, 11, 3, 2, 5, 4, True, 2.0, seed=13)
    o_s, f_s = via_generic_scan(q, k, v, beta, g, h0, 0.5, method="sequential")
    o_c, f_c = chunk_delta_product(q, k, v, beta, g, scale=0.5, initial_state=h0, output_final_state=True,
                                   chunk_size=8, backend="torch")
    _close(o_c, o_s, 1e-10)
    _close(f_c, f_s, 1e-10)


def test_gradcheck_tiny():
    q, k, v, beta, g, h0 = make_inputs(1, 5, 2, 1, 3, 2, True, 2.0, seed=3)
    xs = [x.requires_grad_() for x in (q, k, v, beta, g, h0)]

    def f(q, k, v, b, g, h0):
        o, fs = chunk_delta_product(q, k, v, b, g, initial_state=h0, output_final_state=True,
                                    chunk_size=4, backend="torch")
        return o, fs

    assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-6)


def test_defaults_and_l2norm():
    q, k, v, beta, g, _ = make_inputs(2, 9, 2, 2, 8, 4, True, 1.0, seed=5)
    kr = k * 3.0
    o1, f1 = chunk_delta_product(q, kr, v, beta, g, use_qk_l2norm=True, backend="torch")
    assert f1 is None
    o2, _ = recurrent_delta_product(F.normalize(q, dim=-1), k, v, beta, g)
    _close(o1, o2, 1e-10)
    o3, _ = chunk_delta_product(q, k, v, beta, g)                    # auto -> torch on CPU
    o4, _ = recurrent_delta_product(q, k, v, beta, g, scale=8 ** -0.5)
    _close(o3, o4, 1e-10)


def test_float32_final_state_dtype():
    q, k, v, beta, g, h0 = make_inputs(1, 10, 2, 1, 4, 4, True, 2.0, dtype=torch.float32)
    o, f = chunk_delta_product(q, k, v, beta, g, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.float32 and f.dtype == torch.float32 and f.shape == (1, 1, 4, 4)


def test_reflections_finite_correlated_keys():
    q, k, v, beta, g, h0 = make_inputs(1, 64, 2, 1, 8, 4, False, 2.0, corr=0.98, seed=7)
    beta = torch.full_like(beta, 1.999)
    o, f = chunk_delta_product(q, k, v, beta, None, initial_state=h0, output_final_state=True,
                               backend="torch")
    o_r, f_r = loop_fp64(q, k, v, beta, None, h0, 8 ** -0.5)
    _close(o, o_r, 1e-8)
    _close(f, f_r, 1e-8)


@pytest.mark.parametrize("bad,err,match", [
    (dict(q=torch.zeros(2, 3, 4)), ValueError, "q must have shape"),
    (dict(k=torch.zeros(2, 5, 1, 3, 4)), ValueError, "k must have shape"),
    (dict(v=torch.zeros(2, 5, 2, 2, 3)), ValueError, "v must have shape"),
    (dict(beta=torch.zeros(2, 5, 1, 3)), ValueError, "beta must have shape"),
    (dict(g=torch.zeros(2, 5, 3)), ValueError, "g must have shape"),
    (dict(q=torch.zeros(2, 5, 2, 4, dtype=torch.int64)), TypeError, "q must be a floating"),
    (dict(initial_state=torch.zeros(3, 2, 4, 3)), ValueError, "initial_state must have shape"),
    (dict(chunk_size=0), ValueError, "chunk_size"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(cu_seqlens=torch.tensor([0, 5])), ValueError, "batch size must be 1"),
    (dict(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(scale=True), TypeError, "scale must be a Python float"),
])
def test_bad_inputs(bad, err, match):
    args = dict(q=torch.zeros(2, 5, 2, 4), k=torch.zeros(2, 5, 1, 2, 4), v=torch.zeros(2, 5, 1, 2, 3),
                beta=torch.zeros(2, 5, 1, 2), g=None, initial_state=None, chunk_size=16, backend="torch",
                cu_seqlens=None)
    args.update(bad)
    with pytest.raises(err, match=match):
        chunk_delta_product(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("beta"), args.pop("g"), **args)


def test_bad_cu_seqlens():
    q, k, v, beta, g, _ = make_inputs(1, 10, 1, 1, 4, 4, False, 1.0)
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunk_delta_product(q, k, v, beta, cu_seqlens=torch.tensor([0, 4, 9]))


def test_check_values():
    """``check_values=True`` rejects what the recurrence's domain excludes, naming the argument;
    off (the default) the same inputs run."""
    q, k, v, beta, g, _ = make_inputs(1, 10, 2, 2, 4, 4, True, 2.0)
    chunk_delta_product(q, k, v, beta, g, check_values=True, backend="torch")   # valid inputs pass
    nan_v = v.clone()
    nan_v[0, 3, 1, 0, 2] = float("nan")
    cases = [(dict(v=nan_v), "v has 1 non-finite"), (dict(beta=beta + 2.5), r"beta must lie in \[0, 2\]"),
             (dict(beta=-beta), r"beta must lie in \[0, 2\]"), (dict(g=g.abs() + 0.1), "g is a log-gate"),
             (dict(k=2 * k), "k must have unit L2 norm"),
             (dict(initial_state=torch.full((1, 2, 4, 4), float("inf"), dtype=q.dtype)), "initial_state has 32")]
    for bad, match in cases:
        args = dict(q=q, k=k, v=v, beta=beta, g=g, initial_state=None) | bad
        with pytest.raises(ValueError, match=match):
            chunk_delta_product(**args, check_values=True, backend="torch")
        chunk_delta_product(**args, backend="torch")                             # unchecked: runs
    chunk_delta_product(q, 2 * k, v, beta, g, use_qk_l2norm=True, check_values=True, backend="torch")
