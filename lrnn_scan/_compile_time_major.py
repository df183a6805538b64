"""The time-major ``m = 1`` scan (``diagonal_scan(..., time_dim=2)``, ``kernels/block_diagonal/
time_major.py``) as ``torch.library`` custom ops, for :mod:`lrnn_scan.compile`.

Ops (namespace ``lrnn_scan``): ``tm_scan_fwd(a, b, h0, cu) -> (h, h_final)`` and
``tm_scan_bwd(a, h, h0, g, dhT, cu) -> (da, db, dh0)``, on ``(B, N, T)`` tensors, time contiguous.
Before these existed the compile wrapper transposed to the ``(B, T, N)`` op and back: two extra
passes over ``a``, ``b`` and ``h`` per call. The ops read ``cu_seqlens`` on the host (the longest
sequence picks the tile length), which is why they are opaque to Dynamo.

Nothing here runs at import: :func:`register` is called by ``lrnn_scan.compile.register()``.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["register", "time_major_diagonal_scan"]


def register(ops: dict, scan_mod, tm_mod) -> None:
    """Define ``tm_scan_fwd`` / ``tm_scan_bwd`` into ``ops`` from the block-diagonal launcher
    module ``scan_mod`` (``TUNE``, NaN-poisoning ``_empty``, ``max_seq_len``) and ``tm_mod``
    (``kernels.block_diagonal.time_major``)."""

    def max_len(x: Tensor, cu: Tensor | None) -> int:
        return scan_mod.max_seq_len(x.shape[2], cu)

    def nseq(x: Tensor, cu: Tensor | None) -> int:
        return x.shape[0] if cu is None else cu.shape[0] - 1

    @torch.library.custom_op("lrnn_scan::tm_scan_fwd", mutates_args=())
    def tm_scan_fwd(a: Tensor, b: Tensor, h0: Tensor | None, cu: Tensor | None) -> tuple[Tensor, Tensor]:
        return tm_mod.time_major_forward(a, b, h0, cu, max_len(b, cu), scan_mod.TUNE, scan_mod._empty)

    @tm_scan_fwd.register_fake
    def _(a, b, h0, cu):
        return b.new_empty(b.shape), b.new_empty((nseq(b, cu), b.shape[1]), dtype=torch.float32)

    @torch.library.custom_op("lrnn_scan::tm_scan_bwd", mutates_args=())
    def tm_scan_bwd(a: Tensor, h: Tensor, h0: Tensor | None, g: Tensor, dhT: Tensor | None,
                    cu: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        return tm_mod.time_major_backward(a, h, h0, g, dhT, cu, max_len(h, cu), scan_mod.TUNE,
                                          scan_mod._empty)

    @tm_scan_bwd.register_fake
    def _(a, h, h0, g, dhT, cu):
        return a.new_empty(a.shape), h.new_empty(h.shape), h.new_empty((nseq(h, cu), h.shape[1]),
                                                                        dtype=torch.float32)

    def setup_context(ctx, inputs, output):
        a, _, h0, cu = inputs
        ctx.save_for_backward(a, output[0], h0, cu)
        ctx.h0_dtype = None if h0 is None else h0.dtype

    def backward(ctx, dh, dfinal):
        a, h, h0, cu = ctx.saved_tensors
        g = torch.zeros_like(h) if dh is None else dh.contiguous()
        dhT = None if dfinal is None else dfinal.float().contiguous()
        da, db, dh0 = tm_scan_bwd(a, h, h0, g, dhT, cu)
        return da, db, (None if h0 is None else dh0.to(ctx.h0_dtype)), None

    tm_scan_fwd.register_autograd(backward, setup_context=setup_context)
    ops.update(tm_scan_fwd=tm_scan_fwd, tm_scan_bwd=tm_scan_bwd)


def time_major_diagonal_scan(ops: dict, scan_mod, a, b, initial_state, output_final_state, cu_seqlens,
                             compiling: bool):
    """``diagonal_scan(a, b, ..., time_dim=2)`` through ``tm_scan_fwd``: the eager function's
    argument checks (``cu_seqlens`` only when not tracing: they read it on the host)."""
    for name, x in (("a", a), ("b", b)):
        scan_mod._check_float(name, x, 3, "(B, N, T)")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape (B, N, T), got {tuple(a.shape)} and {tuple(b.shape)}")
    B, N, T = b.shape
    if not compiling:
        scan_mod._check_common(b, "b", B, T, (N,), initial_state, cu_seqlens)
    h0 = initial_state.contiguous() if initial_state is not None else None
    cu = cu_seqlens.to(torch.int64).contiguous() if cu_seqlens is not None else None
    h, final = ops["tm_scan_fwd"](a, b, h0, cu)
    return h, (final if output_final_state else None)
