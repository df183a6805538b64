"""The companion (H-LRU) scans (``kernels/companion``) as ``torch.library`` custom ops, for
:mod:`lrnn_scan.compile`.

Ops (namespace ``lrnn_scan``): ``companion_fwd(z, v, h0, cu, col0, code, eps, out_dtype) ->
(h, h_final, PT)`` and ``companion_bwd(z, v, h0, h, dh, dhf, cu, col0, code, eps, PT) ->
(dz, dv, dh0)``; ``col0 = 1`` for gate logits ``(B, T, N, m + 1)``, 0 for coefficients. They run
``_CompanionFn.forward`` / ``.backward`` with a stand-in ctx, so the launches are eager's. Like
eager, fixed-length batches take the time-chunked passes where ``companion.choose_chunk`` says
so; the chunk is chosen inside the op when it runs (no device query while tracing) and ``PT``
(the chunks' ``P^T``, ``(nseq, chunks, N, m, m)``; ``(nseq, 0, N, m, m)`` for one pass) carries
what the backward needs, its chunk count dynamic in the fake.

Nothing here runs at import: :func:`register` is called by ``lrnn_scan.compile.register()``.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["register"]


def register(ops: dict, fn) -> None:
    """Define ``companion_fwd`` / ``companion_bwd`` into ``ops`` from ``fn``
    (``kernels.companion.function``), with their autograd."""
    from . import compile as C  # the shared helpers (stand-in ctx, fakes' dynamic sizes)
    Fn = fn._CompanionFn

    def chunk_of(v, z, col0, cu):  # eager's time chunks (fixed-length batches), as the fused op
        B, T, N = v.shape
        return fn.choose_chunk(None, B, T, N, z.shape[-1] - col0, v.device, col0 == 1) if cu is None else None

    @torch.library.custom_op("lrnn_scan::companion_fwd", mutates_args=())
    def companion_fwd(z: Tensor, v: Tensor, h0: Tensor | None, cu: Tensor | None, col0: int,
                      code: int, eps: float, out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        ctx, m = C._Ctx(), z.shape[-1] - col0
        h, hf = Fn.forward(ctx, z, v, h0, cu, col0, code, eps, True, out_dtype, chunk_of(v, z, col0, cu))
        PT = ctx.saved_tensors[5]  # (nseq, chunks, N, m, m) or None: one pass
        return h, hf, (PT if PT is not None else hf.new_empty((hf.shape[0], 0, v.shape[2], m, m)))

    @companion_fwd.register_fake
    def _(z, v, h0, cu, col0, code, eps, out_dtype):
        nseq = v.shape[0] if cu is None else cu.shape[0] - 1
        m = z.shape[-1] - col0
        return (v.new_empty(v.shape, dtype=out_dtype),
                v.new_empty((nseq, v.shape[2], m), dtype=torch.float32),
                v.new_empty((nseq, C._dyn(), v.shape[2], m, m), dtype=torch.float32))

    @torch.library.custom_op("lrnn_scan::companion_bwd", mutates_args=())
    def companion_bwd(z: Tensor, v: Tensor, h0: Tensor | None, h: Tensor, dh: Tensor,
                      dhf: Tensor | None, cu: Tensor | None, col0: int, code: int,
                      eps: float, PT: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        chunk = chunk_of(v, z, col0, cu) if PT is not None and PT.shape[1] > 0 else None
        C._check_chunks(chunk, v.shape[1], PT, "companion")
        ctx = C._Ctx(saved_tensors=(z.contiguous(), v.contiguous(),
                                    None if h0 is None else h0.float().contiguous(), h, cu, PT),
                     cfg=(col0, code, eps, h0 is not None, torch.float32, chunk))
        dz, dv, dh0 = Fn.backward(ctx, dh, dhf)[:3]
        return dz, dv, (dh0 if dh0 is not None else C._empty0(v))

    @companion_bwd.register_fake
    def _(z, v, h0, h, dh, dhf, cu, col0, code, eps, PT=None):
        nseq = v.shape[0] if cu is None else cu.shape[0] - 1
        m = z.shape[-1] - col0
        dh0 = (v.new_empty((nseq, v.shape[2], m), dtype=torch.float32) if h0 is not None
               else v.new_empty((0,), dtype=torch.float32))
        return z.new_empty(z.shape), v.new_empty(v.shape), dh0

    C._register_logits_autograd(companion_fwd, companion_bwd)
    ops.update(companion_fwd=companion_fwd, companion_bwd=companion_bwd, comp_module=fn)
