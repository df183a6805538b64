"""``torch.compile`` support: the Triton kernels as ``torch.library`` custom ops.

Dynamo cannot trace into Triton launchers wrapped in ``torch.autograd.Function`` (they read
``cu_seqlens`` on the host, choose launch configurations, etc.). This module registers each kernel
entry point as an opaque ``torch.library.custom_op`` with a fake (meta) implementation, so
``torch.compile(model, fullgraph=True)`` keeps it in the graph, and ``register_autograd`` wiring
the existing *backward launchers* (never recomputing the forward):

===================================================  ===============================================
op (namespace ``lrnn_scan``)                          wraps
===================================================  ===============================================
``bd_scan_fwd`` / ``bd_scan_bwd``                      ``kernels.block_diagonal.scan._run_forward`` /
                                                       ``_run_backward`` with the eager functions'
                                                       plans (``kernels.block_diagonal.plan``)
``tm_scan_fwd`` / ``tm_scan_bwd``                      ``kernels.block_diagonal.time_major`` (in
                                                       :mod:`lrnn_scan._compile_time_major`)
``fused_gate_fwd`` / ``fused_gate_bwd``                ``kernels.fused_gates.function._launch_fwd`` /
                                                       ``_launch_bwd`` (time-chunked as eager)
``companion_fwd`` / ``companion_bwd``                  ``kernels.companion.function._CompanionFn``
                                                       ``.forward`` / ``.backward`` (a stand-in ctx;
                                                       :mod:`lrnn_scan._compile_companion`)
``delta_product_fwd`` / ``delta_product_bwd``          ``kernels.delta_product.function``
                                                       ``.ChunkDeltaProductFunction`` (same way)
``l2norm_fwd`` / ``l2norm_bwd``                        ``kernels.l2norm.function._launch_fwd`` /
                                                       ``_launch_bwd``
===================================================  ===============================================

Public wrappers with the kernels' exact signatures: :func:`block_diagonal_scan`,
:func:`diagonal_scan`, :func:`fused_gate_scan`, :func:`companion_scan`,
:func:`companion_scan_coeffs`, :func:`chunk_delta_product_triton`, :func:`l2_normalize`.

Nothing here runs at ``import lrnn_scan``: this module is not imported by the package, and the ops
are defined on the first call of :func:`register` (which imports Triton and the kernels).
:func:`enable` additionally routes the engine's kernel dispatch (``lrnn_scan.dispatch``,
``lrnn_scan.gated``, ``lrnn_scan.delta``) through the ops by replacing the entry points on the
kernel packages, and sets the Dynamo options the torch paths need for ``fullgraph=True``
(``trace_autograd_ops`` for generic operator adjoints, ``allow_rnn`` for the LSTM baseline);
:func:`disable` undoes both.

Tests: ``tests/test_ecosystem.py`` (CPU, interpreter), ``tests/gpu/test_gpu_compile.py`` (H100).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

from . import _compile_companion, _compile_time_major
from ._kernel_modules import kernel_module

__all__ = ["register", "enable", "disable", "is_enabled", "compile_model", "block_diagonal_scan",
           "diagonal_scan", "fused_gate_scan", "companion_scan", "companion_scan_coeffs",
           "chunk_delta_product_triton", "l2_normalize", "DYNAMO_OPTIONS"]

#: Dynamo options the torch (non-Triton) paths need under ``fullgraph=True`` (see module doc).
DYNAMO_OPTIONS = {"trace_autograd_ops": True, "allow_rnn": True}

_OPS: dict = {}
_SAVED: dict = {}          # (module, attribute) -> original, while enabled
_SAVED_DYNAMO: dict = {}


def _register_logits_autograd(fwd_op, bwd_op) -> None:
    """Autograd of the from-logits ops (fused gates, companion): both save ``(z, v, h0, h, cu)``
    and call their backward op with the same arguments and their third output (the time chunks'
    products ``PT``, no chunks: ``(nseq, 0, ...)``)."""
    def setup_context(ctx, inputs, output):
        z, v, h0, cu, col0, code, eps, _ = inputs
        ctx.save_for_backward(z, v, h0, output[0], cu, *output[2:])
        ctx.cfg = (col0, code, eps, None if h0 is None else h0.dtype)

    def backward(ctx, dh, dhf, *_):
        z, v, h0, h, cu, *pt = ctx.saved_tensors
        col0, code, eps, h0_dtype = ctx.cfg
        dh = torch.zeros_like(h) if dh is None else dh.contiguous()
        dhf = None if dhf is None else dhf.float().contiguous()
        dz, dv, dh0 = bwd_op(z, v, h0, h, dh, dhf, cu, col0, code, eps, *pt)
        return dz, dv, (None if h0 is None else dh0.to(h0_dtype)), None, None, None, None, None

    fwd_op.register_autograd(backward, setup_context=setup_context)


def _kernels(name: str):
    """``lrnn_scan.kernels.<name>`` (or ``kernels.<name>`` from an uninstalled checkout)."""
    return kernel_module(name)


def _compiling() -> bool:
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # pragma: no cover - old torch
        return False


class _Ctx(SimpleNamespace):
    """Stand-in for an autograd ctx, to call a Function's forward/backward launch code directly."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def _empty0(ref: Tensor) -> Tensor:
    return ref.new_empty((0,), dtype=torch.float32)


def _dyn():
    return torch.library.get_ctx().new_dynamic_size()


def _check_chunks(chunk, T: int, PT, family: str) -> None:
    """The backward op re-chooses the forward's time chunks by the same rule: they must agree with
    the forward's chunk products ``PT`` ``(nseq, chunks or 0, ...)``."""
    if PT is not None and PT.shape[1] > 0 and (chunk is None or -(-T // chunk) != PT.shape[1]):
        raise RuntimeError(f"{family}.TUNE's chunk keys changed since the forward")


# ============================================================================ block diagonal
def _p_shape(b: Tensor, nseq, nc, diag: bool):
    if diag:
        return (nseq, nc, b.shape[2])
    return (nseq, nc, b.shape[2], b.shape[3], b.shape[3])


def _register_block_diagonal():
    mod = _kernels("block_diagonal.scan")
    plan = _kernels("block_diagonal.plan")

    def nseq_len(b, cu):
        return (b.shape[0] if cu is None else cu.numel() - 1), mod.max_seq_len(b.shape[1], cu)

    @torch.library.custom_op("lrnn_scan::bd_scan_fwd", mutates_args=())
    def bd_scan_fwd(A: Tensor, b: Tensor, h0: Tensor | None, cu: Tensor | None,
                    diag: bool, grad: bool) -> tuple[Tensor, Tensor, Tensor]:
        # the eager functions' plan (plan.py): the same kernels compiled as eager; ``grad``: the
        # caller's inputs require gradients (scan._needs_grad; the op runs without autograd)
        nseq, max_len = nseq_len(b, cu)
        chunk, lookback, _ = (plan.diag_plan(b, nseq, max_len, grad, cu is not None) if diag
                              else plan.bd_plan(A, b, nseq, max_len, grad))
        h, final, P = mod._run_forward(A, b, h0, cu, chunk, diag, lookback, max_len)
        if P is None:
            P = torch.empty(_p_shape(b, nseq, 0, diag), dtype=torch.float32, device=b.device)
        return h, final, P

    @bd_scan_fwd.register_fake
    def _(A, b, h0, cu, diag, grad):
        nseq = b.shape[0] if cu is None else cu.shape[0] - 1
        state = (nseq, b.shape[2]) if diag else (nseq, b.shape[2], b.shape[3])
        # chunks or none: the plan reads sequence lengths (cu) and TMA alignment (data pointers)
        return (_dense_like(b), b.new_empty(state, dtype=torch.float32),
                b.new_empty(_p_shape(b, nseq, _dyn(), diag), dtype=torch.float32))

    @torch.library.custom_op("lrnn_scan::bd_scan_bwd", mutates_args=())
    def bd_scan_bwd(A: Tensor, h: Tensor, h0: Tensor | None, g: Tensor, dhT: Tensor | None,
                    cu: Tensor | None, P: Tensor, diag: bool) -> tuple[Tensor, Tensor, Tensor]:
        nseq, max_len = nseq_len(h, cu)
        chunk, bwd_lb = plan.backward_plan(A, h, nseq, max_len, diag, P.shape[1] > 0, cu is not None)
        return mod._run_backward(A, h, h0, g, dhT, cu, chunk, None if chunk is None else P, diag,
                                 bwd_lb, max_len)

    @bd_scan_bwd.register_fake
    def _(A, h, h0, g, dhT, cu, P, diag):
        nseq = h.shape[0] if cu is None else cu.shape[0] - 1
        state = (nseq, h.shape[2]) if diag else (nseq, h.shape[2], h.shape[3])
        return _dense_like(A), _dense_like(h), h.new_empty(state, dtype=torch.float32)

    def setup_context(ctx, inputs, output):
        A, b, h0, cu, diag, _ = inputs
        h, _, P = output
        ctx.save_for_backward(A, h, h0, cu, P)
        ctx.diag = diag
        ctx.h0_dtype = None if h0 is None else h0.dtype

    def backward(ctx, dh, dfinal, dP):
        A, h, h0, cu, P = ctx.saved_tensors
        g = torch.zeros_like(h) if dh is None else dh.contiguous()
        dhT = None if dfinal is None else dfinal.float().contiguous()
        dA, db, dh0 = bd_scan_bwd(A, h, h0, g, dhT, cu, P, ctx.diag)
        return dA, db, (None if h0 is None else dh0.to(ctx.h0_dtype)), None, None, None

    bd_scan_fwd.register_autograd(backward, setup_context=setup_context)
    _OPS.update(bd_scan_fwd=bd_scan_fwd, bd_scan_bwd=bd_scan_bwd, bd_module=mod)


def _dense_like(x):
    """Fake kernel output shaped like ``x``, contiguous as the launchers return it (Inductor checks
    the strides; ``torch.empty_like`` copied a non-contiguous input's, failing on an H100)."""
    return x.new_empty(x.shape)


def block_diagonal_scan(A, b, initial_state=None, output_final_state=False, cu_seqlens=None):
    """:func:`lrnn_scan.kernels.block_diagonal.block_diagonal_scan` through the custom op."""
    register()
    mod = _OPS["bd_module"]
    mod._check_float("A", A, 5, "(B, T, H, m, m)")
    mod._check_float("b", b, 4, "(B, T, H, m)")
    B, T, H, m = b.shape
    if tuple(A.shape) != (B, T, H, m, m):
        raise ValueError(f"A must have shape (B, T, H, m, m) = {(B, T, H, m, m)} to match b "
                         f"{tuple(b.shape)}, got {tuple(A.shape)}")
    if not 1 <= m <= mod.MAX_M:
        raise ValueError(f"block size m (b.shape[-1]) must be in 1..{mod.MAX_M}, got {m}")
    if not _compiling():
        mod._check_common(b, "b", B, T, (H, m), initial_state, cu_seqlens)
    nseq = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    h0 = initial_state.contiguous() if initial_state is not None else None
    cu = cu_seqlens.to(torch.int64).contiguous() if cu_seqlens is not None else None
    if m == 1:
        h, final, _ = _OPS["bd_scan_fwd"](A.view(B, T, H), b.view(B, T, H),
                                          None if h0 is None else h0.view(nseq, H), cu, True,
                                          mod._needs_grad(A, b, h0))
        h, final = h.view(B, T, H, 1), final.view(nseq, H, 1)
    else:
        h, final, _ = _OPS["bd_scan_fwd"](A, b, h0, cu, False, mod._needs_grad(A, b, h0))
    return h, (final if output_final_state else None)


def diagonal_scan(a, b, initial_state=None, output_final_state=False, cu_seqlens=None, *, time_dim=1):
    """:func:`lrnn_scan.kernels.block_diagonal.diagonal_scan` through the custom ops (``time_dim=2``:
    ``tm_scan_fwd``, ``lrnn_scan._compile_time_major``)."""
    register()
    mod = _OPS["bd_module"]
    if time_dim != 1:
        mod._check_time_dim(time_dim)
        return _compile_time_major.time_major_diagonal_scan(_OPS, mod, a, b, initial_state,
                                                            output_final_state, cu_seqlens, _compiling())
    mod._check_float("a", a, 3, "(B, T, N)")
    mod._check_float("b", b, 3, "(B, T, N)")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape (B, T, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    B, T, N = b.shape
    if not _compiling():
        mod._check_common(b, "b", B, T, (N,), initial_state, cu_seqlens)
    h0 = initial_state.contiguous() if initial_state is not None else None
    cu = cu_seqlens.to(torch.int64).contiguous() if cu_seqlens is not None else None
    h, final, _ = _OPS["bd_scan_fwd"](a, b, h0, cu, True, mod._needs_grad(a, b, h0))
    return h, (final if output_final_state else None)


# ============================================================================ fused gates
def _register_fused_gates():
    fn = _kernels("fused_gates.function")

    # eager's time chunks (fixed-length batches), chosen in the op; PT: (nseq, chunks or 0, H, m, m)
    @torch.library.custom_op("lrnn_scan::fused_gate_fwd", mutates_args=())
    def fused_gate_fwd(z: Tensor, v: Tensor, h0: Tensor | None, cu: Tensor | None, col0: int,
                       code: int, eps: float, out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        B, T, H, m = v.shape
        h0c = h0.float().contiguous() if h0 is not None else None
        chunk = fn.choose_chunk(None, B, T, H, m, v.device) if col0 == 1 and cu is None else None
        out = fn._launch_fwd(z.contiguous(), v.contiguous(), h0c, cu, T, H, m, col0, code, eps,
                             True, out_dtype, chunk)
        return out[0], out[1], (out[2] if chunk else out[1].new_empty((out[1].shape[0], 0, H, m, m)))

    @fused_gate_fwd.register_fake
    def _(z, v, h0, cu, col0, code, eps, out_dtype):
        B, T, H, m = v.shape
        nseq = B if cu is None else cu.shape[0] - 1
        return (v.new_empty(v.shape, dtype=out_dtype), v.new_empty((nseq, H, m), dtype=torch.float32),
                v.new_empty((nseq, _dyn(), H, m, m), dtype=torch.float32))

    @torch.library.custom_op("lrnn_scan::fused_gate_bwd", mutates_args=())
    def fused_gate_bwd(z: Tensor, v: Tensor, h0: Tensor | None, h: Tensor, dh: Tensor,
                       dhf: Tensor | None, cu: Tensor | None, col0: int, code: int,
                       eps: float, PT: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        B, T, H, m = v.shape
        h0c = h0.float().contiguous() if h0 is not None else None
        chunk = fn.choose_chunk(None, B, T, H, m, v.device) if PT is not None and PT.shape[1] > 0 else None
        _check_chunks(chunk, T, PT, "fused_gates")
        dz, dv, dh0 = fn._launch_bwd(z.contiguous(), v.contiguous(), h0c, h, dh, dhf, cu, T, H, m,
                                     col0, code, eps, h0 is not None, chunk, PT)
        return dz, dv, (dh0 if dh0 is not None else _empty0(v))

    @fused_gate_bwd.register_fake
    def _(z, v, h0, h, dh, dhf, cu, col0, code, eps, PT=None):
        nseq = v.shape[0] if cu is None else cu.shape[0] - 1
        dh0 = (v.new_empty((nseq, v.shape[2], v.shape[3]), dtype=torch.float32)
               if h0 is not None else v.new_empty((0,), dtype=torch.float32))
        return z.new_empty(z.shape), v.new_empty(v.shape), dh0

    _register_logits_autograd(fused_gate_fwd, fused_gate_bwd)
    _OPS.update(fused_gate_fwd=fused_gate_fwd, fused_gate_bwd=fused_gate_bwd, fg_module=fn)


def fused_gate_scan(logits, v, variant="softmax", eps=1e-6, initial_state=None,
                    output_final_state=False, cu_seqlens=None):
    """:func:`lrnn_scan.kernels.fused_gates.fused_gate_scan` through the custom op."""
    register()
    fn = _OPS["fg_module"]
    if not fn.use_triton(v, fn.block_scan_fwd_kernel):
        return _SAVED.get(("fused_gates", "fused_gate_scan"), fn.fused_gate_scan)(
            logits, v, variant, eps, initial_state, output_final_state, cu_seqlens)
    fn.check_float_tensor("logits", logits, 5, "(B, T, H, m, m+1)")
    fn.check_float_tensor("v", v, 4, "(B, T, H, m)")
    B, T, H, m = v.shape
    if tuple(logits.shape) != (B, T, H, m, m + 1):
        raise ValueError(f"logits must have shape (B, T, H, m, m+1) = {(B, T, H, m, m + 1)} to "
                         f"match v {tuple(v.shape)}, got {tuple(logits.shape)}")
    eps = fn.check_eps(eps)
    code = fn.variant_code(variant)
    if not _compiling():
        fn._check_common(v, initial_state, cu_seqlens, B, T, H, m)
    out_dtype = torch.promote_types(logits.dtype, v.dtype)
    h, hf, _ = _OPS["fused_gate_fwd"](logits, v, initial_state, cu_seqlens, 1, code, eps, out_dtype)
    return h, (hf if output_final_state else None)


# ============================================================================ companion
def _companion(z_name, z, v_name, v, col0, variant, eps, initial_state, output_final_state,
               cu_seqlens):
    fn = _OPS["comp_module"]
    if not _compiling():
        fn._check(z_name, z, v_name, v, col0, initial_state, cu_seqlens)
    if col0:
        eps, code = fn.check_eps(eps), fn.variant_code(variant)
    else:
        eps, code = 1.0, 5
    out_dtype = torch.promote_types(z.dtype, v.dtype)
    h, hf, _ = _OPS["companion_fwd"](z, v, initial_state, cu_seqlens, col0, code, eps, out_dtype)
    return h, (hf if output_final_state else None)


def companion_scan(logits, v, variant="softmax", eps=1e-6, initial_state=None,
                   output_final_state=False, cu_seqlens=None):
    """:func:`lrnn_scan.kernels.companion.companion_scan` through the custom op."""
    register()
    fn = _OPS["comp_module"]
    if not fn.use_triton(v, fn.companion_fwd_kernel):
        return _SAVED.get(("companion", "companion_scan"), fn.companion_scan)(
            logits, v, variant, eps, initial_state, output_final_state, cu_seqlens)
    return _companion("logits", logits, "v", v, 1, variant, eps, initial_state,
                      output_final_state, cu_seqlens)


def companion_scan_coeffs(a, b, initial_state=None, output_final_state=False, cu_seqlens=None):
    """:func:`lrnn_scan.kernels.companion.companion_scan_coeffs` through the custom op."""
    register()
    fn = _OPS["comp_module"]
    if not fn.use_triton(b, fn.companion_fwd_kernel):
        return _SAVED.get(("companion", "companion_scan_coeffs"), fn.companion_scan_coeffs)(
            a, b, initial_state, output_final_state, cu_seqlens)
    return _companion("a", a, "b", b, 0, "softmax", 1.0, initial_state, output_final_state,
                      cu_seqlens)


# ============================================================================ DeltaProduct
def _register_delta():
    fn = _kernels("delta_product.function")
    Fn = fn.ChunkDeltaProductFunction

    def _meta(q, k, v, beta, g, h0, scale, cu, chunk_size):
        B, T, H, K = q.shape
        n_h, V = k.shape[2], v.shape[-1]
        BC, BK, BVf, BV, dot = fn._cfg(q, k, v, chunk_size)
        ch = fn.build_chunks(B, T, n_h, BC, cu, q.device)
        use_g = g is not None
        return (B, T, H, K, V, n_h, BC, BK, BVf, BV, dot, scale, use_g, ch, h0 is not None,
                q.dtype, k.dtype, v.dtype, beta.dtype, g.dtype if use_g else None,
                h0.dtype if h0 is not None else None)

    # form: 0 = W, U stored and returned; 1 / 2 = formed in the state kernels ("wu" / "assoc",
    # kernels/delta_product TUNE["fuse_wu"]), W and U returned empty. An argument rather than read
    # from TUNE inside, so the fake implementation and the backward agree with the forward.
    @torch.library.custom_op("lrnn_scan::delta_product_fwd", mutates_args=())
    def delta_product_fwd(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
                          h0: Tensor | None, scale: float, cu: Tensor | None, chunk_size: int,
                          form: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        ctx = _Ctx(form_request=form)
        o, hT = Fn.forward(ctx, q, k, v, beta, g, h0, scale, True, cu, chunk_size)
        gcum, Ainv, W, U = ctx.saved_tensors[6:10]   # [10:]: states kept (save_states), None here
        if g is None:                    # gcum is then beta itself: outputs must not alias inputs
            gcum = _empty0(q)
        return o, hT, gcum, Ainv, (W if form == 0 else _empty0(q)), (U if form == 0 else _empty0(q))

    @delta_product_fwd.register_fake
    def _(q, k, v, beta, g, h0, scale, cu, chunk_size, form):
        B, T, H, K = q.shape
        n_h, V = k.shape[2], v.shape[-1]
        BC = fn._cfg(q, k, v, chunk_size)[0]
        Ls = B * T * n_h
        N = B if cu is None else cu.shape[0] - 1
        NC = B * (-(-(T * n_h) // BC)) if cu is None else _dyn()
        f32 = dict(dtype=torch.float32)
        return (q.new_empty((B, T, H, V)), q.new_empty((N, H, K, V), **f32),
                q.new_empty((Ls, H) if g is not None else (0,), **f32),
                q.new_empty((NC, H, BC, BC), **f32), q.new_empty((Ls, H, K) if form == 0 else (0,), **f32),
                q.new_empty((Ls, H, V) if form == 0 else (0,), **f32))

    @torch.library.custom_op("lrnn_scan::delta_product_bwd", mutates_args=())
    def delta_product_bwd(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
                          h0: Tensor | None, gcum: Tensor, Ainv: Tensor, W: Tensor, U: Tensor,
                          do: Tensor, dhT: Tensor | None, scale: float, cu: Tensor | None,
                          chunk_size: int, form: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        meta = _meta(q, k, v, beta, g, h0, scale, cu, chunk_size)
        B, T, H, K, V, n_h = meta[:6]
        Ls = B * T * n_h
        bf = beta.reshape(Ls, H).contiguous()
        saved = (q.reshape(B * T, H, K).contiguous(), k.reshape(Ls, H, K).contiguous(),
                 v.reshape(Ls, H, V).contiguous(), bf,
                 g.reshape(B * T, H).contiguous() if g is not None else None,
                 h0.float().contiguous() if h0 is not None else None,
                 gcum if g is not None else bf, Ainv, (W if form == 0 else None), (U if form == 0 else None),
                 None, None)                  # states: the backward recomputes them
        dq, dk, dv, db, dg, dh0 = Fn.backward(_Ctx(saved_tensors=saved, meta=meta, form=form), do, dhT)[:6]
        return (dq, dk, dv, db, dg if dg is not None else _empty0(q),
                dh0 if dh0 is not None else _empty0(q))

    @delta_product_bwd.register_fake
    def _(q, k, v, beta, g, h0, gcum, Ainv, W, U, do, dhT, scale, cu, chunk_size, form):
        e = q.new_empty((0,), dtype=torch.float32)
        return (_dense_like(q), _dense_like(k), _dense_like(v), _dense_like(beta),
                _dense_like(g) if g is not None else e, _dense_like(h0) if h0 is not None else e)

    def setup_context(ctx, inputs, output):
        q, k, v, beta, g, h0, scale, cu, chunk_size, form = inputs
        _, _, gcum, Ainv, W, U = output
        ctx.save_for_backward(q, k, v, beta, g, h0, cu, gcum, Ainv, W, U)
        ctx.cfg = (scale, chunk_size, form)

    def backward(ctx, do, dhT, *_):
        q, k, v, beta, g, h0, cu, gcum, Ainv, W, U = ctx.saved_tensors
        scale, chunk_size, form = ctx.cfg
        do = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device) \
            if do is None else do
        dq, dk, dv, db, dg, dh0 = delta_product_bwd(q, k, v, beta, g, h0, gcum, Ainv, W, U, do,
                                                    dhT, scale, cu, chunk_size, form)
        return (dq, dk, dv, db, dg if g is not None else None, dh0 if h0 is not None else None,
                None, None, None, None)

    delta_product_fwd.register_autograd(backward, setup_context=setup_context)
    _OPS.update(delta_product_fwd=delta_product_fwd, delta_product_bwd=delta_product_bwd,
                delta_module=fn)


def chunk_delta_product_triton(q, k, v, beta, g=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, chunk_size=64):
    """:func:`lrnn_scan.kernels.delta_product.chunk_delta_product_triton` through the custom op
    (inputs validated by :func:`lrnn_scan.delta.chunk_delta_product`)."""
    register()
    if q.dtype == torch.float64:
        raise TypeError("the Triton backend does not take float64 inputs; use backend='torch'")
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    form = _OPS["delta_module"]._fuse_form()  # TUNE["fuse_wu"] at trace time, fixed in the graph
    o, hT = _OPS["delta_product_fwd"](q, k, v, beta, g, initial_state, scale, cu_seqlens,
                                      int(chunk_size), form)[:2]
    return o, (hT if output_final_state else None)


# ============================================================================ L2 normalisation
def _register_l2norm():
    fn = _kernels("l2norm.function")

    @torch.library.custom_op("lrnn_scan::l2norm_fwd", mutates_args=())
    def l2norm_fwd(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        y, rstd = fn._launch_fwd(x.reshape(-1, x.shape[-1]).contiguous(), eps)
        return y.view(x.shape), rstd

    @l2norm_fwd.register_fake
    def _(x, eps):
        return x.new_empty(x.shape), x.new_empty((x.numel() // x.shape[-1],), dtype=torch.float32)

    @torch.library.custom_op("lrnn_scan::l2norm_bwd", mutates_args=())
    def l2norm_bwd(x: Tensor, rstd: Tensor, dy: Tensor, eps: float) -> Tensor:
        K = x.shape[-1]
        dx = fn._launch_bwd(x.reshape(-1, K).contiguous(), rstd, dy.reshape(-1, K).contiguous(), eps)
        return dx.view(x.shape)

    @l2norm_bwd.register_fake
    def _(x, rstd, dy, eps):
        return _dense_like(x)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output[1])
        ctx.eps = inputs[1]

    def backward(ctx, dy, _drstd):
        x, rstd = ctx.saved_tensors
        return l2norm_bwd(x, rstd, dy, ctx.eps), None

    l2norm_fwd.register_autograd(backward, setup_context=setup_context)
    _OPS.update(l2norm_fwd=l2norm_fwd, l2norm_bwd=l2norm_bwd, l2norm_module=fn)


def l2_normalize(x, eps=1e-12):
    """:func:`lrnn_scan.kernels.l2norm.l2_normalize` through the custom op."""
    register()
    fn = _OPS["l2norm_module"]
    K = x.shape[-1] if x.dim() else 0
    if (x.dtype == torch.float64 or not 0 < K <= fn.MAX_K or x.numel() == 0
            or not fn.use_triton(x, fn.l2norm_fwd_kernel)):
        return _SAVED.get(("l2norm", "l2_normalize"), fn.l2_normalize)(x, eps)
    return _OPS["l2norm_fwd"](x, float(eps))[0]


# ============================================================================ registration
def register() -> dict:
    """Define the custom ops (once; imports Triton and the kernels). Returns the op table.
    Call it (or :func:`enable`) before ``torch.compile`` traces a wrapper here: Dynamo cannot
    trace the imports that defining the ops needs (a clear error says so)."""
    if not _OPS:
        if _compiling():
            raise RuntimeError("lrnn_scan.compile: the custom ops are not registered yet; call "
                               "lrnn_scan.compile.register() or enable() before torch.compile "
                               "traces lrnn_scan.compile's wrappers")
        _register_block_diagonal()
        _compile_time_major.register(_OPS, _OPS["bd_module"], _kernels("block_diagonal.time_major"))
        _register_fused_gates()
        _compile_companion.register(_OPS, _kernels("companion.function"))
        _register_delta()
        _register_l2norm()
    for pkg in ("block_diagonal", "fused_gates", "companion", "delta_product", "l2norm"):
        kernel_module(pkg)      # cached, so the engine's lookups trace under torch.compile
    return _OPS


_ROUTES = [("block_diagonal", "block_diagonal_scan", block_diagonal_scan),
           ("block_diagonal", "diagonal_scan", diagonal_scan),
           ("fused_gates", "fused_gate_scan", fused_gate_scan),
           ("companion", "companion_scan", companion_scan),
           ("companion", "companion_scan_coeffs", companion_scan_coeffs),
           ("delta_product", "chunk_delta_product_triton", chunk_delta_product_triton),
           ("l2norm", "l2_normalize", l2_normalize)]


def enable(*, route_kernels: bool = True, dynamo_options: bool = True) -> None:
    """Register the ops; route the engine's kernel calls through them; set :data:`DYNAMO_OPTIONS`.

    The engine looks kernels up by attribute at call time (``lrnn_scan.dispatch``,
    ``lrnn_scan.gated``, ``lrnn_scan.delta``), so replacing the attributes of the kernel packages
    is enough; :func:`disable` restores them.
    """
    register()
    if route_kernels:
        for pkg, name, wrapper in _ROUTES:
            mod = _kernels(pkg)
            if (pkg, name) not in _SAVED:
                _SAVED[(pkg, name)] = getattr(mod, name)
            setattr(mod, name, wrapper)
    if dynamo_options:
        import torch._dynamo.config as dcfg
        for k, v in DYNAMO_OPTIONS.items():
            if hasattr(dcfg, k):
                _SAVED_DYNAMO.setdefault(k, getattr(dcfg, k))
                setattr(dcfg, k, v)


def disable() -> None:
    """Undo :func:`enable` (the ops stay registered; registration cannot be undone)."""
    for (pkg, name), orig in list(_SAVED.items()):
        setattr(_kernels(pkg), name, orig)
        del _SAVED[(pkg, name)]
    import torch._dynamo.config as dcfg
    for k, v in list(_SAVED_DYNAMO.items()):
        setattr(dcfg, k, v)
        del _SAVED_DYNAMO[k]


def is_enabled() -> bool:
    return bool(_SAVED)


def compile_model(model, **kwargs):
    """``enable()`` then ``torch.compile(model, fullgraph=True, **kwargs)``."""
    enable()
    kwargs.setdefault("fullgraph", True)
    return torch.compile(model, **kwargs)
