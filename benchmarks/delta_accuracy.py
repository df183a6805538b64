"""bf16 accuracy of a DeltaProduct implementation against the fp64 reference (issue 4's bound).

The inputs are ``tests/gpu/test_gpu_delta.py``'s: fp64 draws rounded to bf16, with the reference
(``chunk_delta_product(..., backend="torch")`` in fp64) taking the same rounded values, so the error
measured is the implementation's own. The metric is the relative RMS error
``||x - x_ref|| / ||x_ref||`` of the output and of every input gradient; our bound is 5e-3.

``error_vs_fp64`` measures any callable with our argument layout, so that a peer (fla's
``chunk_gated_delta_product``) is held to the same bound on the same inputs as ours
(``benchmarks/delta_throughput.py --fla-accuracy``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

ERR_BOUND = 5e-3


def bf16_case(B, T, n_h, H, K, V, gated, beta_max, seed, device, dtype=torch.bfloat16, corr=0.0):
    """``(fp64 inputs, low-precision inputs)``, each ``[q, k, v, beta, g, h0]`` in our layout (``q:
    [B, T, H, K]``, ``k: [B, T, n_h, H, K]`` unit rows, ``v: [B, T, n_h, H, V]``, ``beta: [B, T,
    n_h, H]`` in ``[0, beta_max]``, ``g: [B, T, H]`` log-gates or None, ``h0: [B, H, K, V]`` fp32);
    the fp64 list holds the values rounded to ``dtype``. ``corr`` in ``[0, 1)``: every key leans
    towards one shared random direction per head (highly correlated keys, the β → 2 stress case)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=torch.float64)  # noqa: E731
    q = r(B, T, H, K)
    k = r(B, T, n_h, H, K)
    if corr:
        k = corr * r(1, 1, 1, H, K) + (1 - corr) * k
    k = F.normalize(k, dim=-1)
    v = r(B, T, n_h, H, V)
    beta = torch.rand(B, T, n_h, H, generator=gen, device=device, dtype=torch.float64) * beta_max
    g = F.logsigmoid(r(B, T, H) + 3.0) if gated else None
    h0 = r(B, H, K, V) * 0.1
    lo = [x.to(dtype) if x is not None else None for x in (q, k, v, beta, g)] + [h0.float()]
    return [x.double() if x is not None else None for x in lo], lo


def _output_and_grads(call, xs, do):
    xs = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
    o = call(*xs)
    live = [x for x in xs if x is not None]
    return [o.detach()] + list(torch.autograd.grad((o.double() * do).sum(), live))


def error_vs_fp64(call, n_h, gated, K, device, B=2, T=1024, H=4, beta_max=2.0, seed=0):
    """``(worst error, its name, {name: error})`` of ``call(q, k, v, beta, g) -> o`` (``o: [B, T, H,
    V]``, no initial state) on bf16 inputs against the fp64 reference: the output ``o`` and the
    gradients ``dq, dk, dv, dbeta`` (and ``dg`` when gated) of one random output cotangent. NaN
    counts as the worst. ``V = K``; the defaults are ``--variants``' check size (B2 T1024 H4, β ≤ 2).

    Example (our Triton path; any callable with this layout works)::

        from lrnn_scan.delta import chunk_delta_product
        err, name, _ = error_vs_fp64(
            lambda q, k, v, b, g: chunk_delta_product(q, k, v, b, g, backend="triton")[0],
            n_h=2, gated=True, K=128, device="cuda")
    """
    from lrnn_scan.delta import chunk_delta_product

    ref_in, lo_in = bf16_case(B, T, n_h, H, K, K, gated, beta_max, seed, device)
    gen = torch.Generator(device=device).manual_seed(seed + 9)
    do = torch.randn(B, T, H, K, generator=gen, device=device, dtype=torch.float64)
    ref = _output_and_grads(
        lambda q, k, v, b, g: chunk_delta_product(q, k, v, b, g, chunk_size=64, backend="torch")[0],
        ref_in[:5], do)
    got = _output_and_grads(call, lo_in[:5], do)
    labels = ["o", "dq", "dk", "dv", "dbeta"] + (["dg"] if gated else [])
    res = {lab: ((x.double().reshape(y.shape) - y).norm() / y.norm()).item()
           for lab, x, y in zip(labels, got, ref)}
    worst = max(res, key=lambda n: res[n] if res[n] == res[n] else float("inf"))
    return res[worst], worst, res


def fla_layout(fla, n_h):
    """fla's ``chunk_gated_delta_product`` as a callable of our layout (its keys, values and step
    sizes interleave the ``n_h`` Householder steps along time: ``[B, T·n_h, H, ·]``)."""
    return lambda q, k, v, b, g: fla(q=q, k=k.flatten(1, 2), v=v.flatten(1, 2), g=g,
                                     beta=b.flatten(1, 2), num_householder=n_h)[0]


def emulate_gpu_rounding():
    """Make the Triton interpreter round like the GPU: ``tf32`` dots truncate their fp32 operands to
    10 mantissa bits (as Hopper's tf32 MMA takes them) and fp32 -> bf16 casts round to nearest even
    (the interpreter truncates them). With this the interpreter gives 4.697e-3 (dk) for the default
    path's worst case (n_h=3 ungated, B=2 T=1024 H=4), the H200's figure being 4.71e-3 (dk)."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as itp
    from triton._C.libtriton import ir

    B = itp.InterpreterBuilder
    dot0, cast0 = B.create_dot, B.cast_impl

    def trunc(x):
        return (np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32:
            a, b = itp.TensorHandle(trunc(a.data), a.dtype), itp.TensorHandle(trunc(b.data), b.dtype)
        return dot0(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
            return itp.TensorHandle(t.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast0(self, src, dst_type)

    B.create_dot, B.cast_impl = create_dot, cast_impl
