"""Forward pass with one row of a block per thread and the state exchanged by warp shuffles
(``m = 4, 8, 16``), for unchunked passes whose time is the chain of steps.

Why: in the ring forward (``fwd.py``) a step's ``A_t x`` is split over threads that each hold 4
columns of a row, so the new state has to reach the threads of the next step's columns through
shared memory (sm_90a, Triton 3.6, ``m = 8``: a store, a ``bar.sync`` and a 16-byte load per step,
then a shuffle to finish each row's sum), about 115 cycles a step on the dependent chain. At B8
T2048 N768 the ``m = 8`` forward is that chain (2048 steps at about 100 ns; README.md "Few
programs"). Here the 32 lanes of a one-warp program are the rows of ``32 / m`` blocks: ``A_t`` is
loaded as ``m / 4`` pieces of ``(32, 4)`` (16 bytes a lane each), so a lane holds its whole row
and the row sum is in-thread (``m / 4`` independent chains of 4 FMAs), and the next state goes to
the lanes as ``tl.gather`` along the lane axis, which Triton lowers to ``m`` independent
``shfl.idx`` (no shared memory, no barrier). For ``m = 8`` the loop's chain is 8 FMAs in 2 chains,
an add and the shuffles, about 50 cycles.

Loads go through Triton's pipeliner (``tl.range(num_stages=NS)``: ``cp.async`` copies ``NS - 1``
steps ahead), since they do not depend on the state.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .fwd import _seq_bounds

__all__ = ["bd_rows_forward", "bd_rows_use", "bd_rows_cfg"]


@triton.jit
def _gather_state(x, base, k4, K: tl.constexpr, R: tl.constexpr):
    """Columns ``4K .. 4K + 3`` of each lane's block state as ``(R, 4)``: lane ``r`` gets
    ``x[base[r] + 4K + j]`` from the lanes that hold those rows (warp shuffles)."""
    return tl.gather(tl.broadcast_to(x[:, None], (R, 4)), base[:, None] + 4 * K + k4[None, :], 0)


@triton.jit
def _row_dot(a, xs, K: tl.constexpr):
    """``sum_j A[r, 4K + j] x[4K + j]`` for piece ``K`` (in-thread)."""
    return tl.sum(a.to(tl.float32) * xs, axis=1)


@triton.jit(do_not_specialize=["T"])
def _bd_fwd_rows(A, Bv, Hout, Init, Final, CU, T, H,
                 M: tl.constexpr, NS: tl.constexpr, HAS_INIT: tl.constexpr,
                 STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t`` over one whole sequence for ``32 / M`` blocks (one warp).
    ``A (rows, H, M, M)``, ``b``/``h (rows, H, M)`` with rows = ``B*T`` (``B == 1`` with ``CU``),
    ``Init``/``Final (nseq, H, M)`` fp32. ``M`` is 4, 8 or 16."""
    R: tl.constexpr = 32
    BH: tl.constexpr = R // M
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    bos, eos, t0, t1 = _seq_bounds(CU, s, s * 0, T, T, VARLEN)  # the whole sequence: [bos, eos)
    r = tl.arange(0, R)
    k4 = tl.arange(0, 4)
    blk = pid_h * BH + r // M
    ok = blk < H
    HM = H * M
    HMM = HM * M
    offs_s = pid_h * (BH * M) + r  # the lane's state entry within a time row
    offs_a = offs_s[:, None] * M + k4[None, :]  # piece 0 of the lane's row of A
    base = (r // M) * M  # the lane of the block's row 0
    so = s.to(tl.int64) * HM
    if HAS_INIT:
        x = tl.load(Init + so + offs_s, mask=ok, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([R], dtype=tl.float32)
    x0 = _gather_state(x, base, k4, 0, R)
    if M >= 8:
        x1 = _gather_state(x, base, k4, 1, R)
    if M >= 16:
        x2 = _gather_state(x, base, k4, 2, R)
        x3 = _gather_state(x, base, k4, 3, R)
    okp = ok[:, None]
    for t in tl.range(t0, t1, num_stages=NS):
        pa = A + t * HMM + offs_a
        acc = tl.load(Bv + t * HM + offs_s, mask=ok, other=0.0).to(tl.float32)
        acc += _row_dot(tl.load(pa, mask=okp, other=0.0), x0, 0)
        if M >= 8:
            acc += _row_dot(tl.load(pa + 4, mask=okp, other=0.0), x1, 1)
        if M >= 16:
            acc += _row_dot(tl.load(pa + 8, mask=okp, other=0.0), x2, 2)
            acc += _row_dot(tl.load(pa + 12, mask=okp, other=0.0), x3, 3)
        tl.store(Hout + t * HM + offs_s, acc.to(Hout.dtype.element_ty), mask=ok)
        x = acc
        x0 = _gather_state(x, base, k4, 0, R)
        if M >= 8:
            x1 = _gather_state(x, base, k4, 1, R)
        if M >= 16:
            x2 = _gather_state(x, base, k4, 2, R)
            x3 = _gather_state(x, base, k4, 3, R)
    if STORE_FINAL:
        tl.store(Final + so + offs_s, x, mask=ok)


def bd_rows_use(tune: dict, m: int, few: bool) -> bool:
    """Whether an unchunked ``m >= 2`` forward pass (``scan._bd_forward``) is this kernel.
    ``few``: the ring forward would have fewer than 3 programs per SM (``scan._bd_forward``).
    ``TUNE["bd_rows"]``: ``"auto"`` (default) where measured faster, ``True`` for every ``m`` in
    (4, 8, 16), ``False`` never."""
    mode = tune.get("bd_rows", False)
    if mode not in (False, True, "auto"):
        raise ValueError(f"TUNE['bd_rows'] must be 'auto', False or True, got {mode!r}")
    if m not in (4, 8, 16) or "variant" in tune:
        return False
    if mode == "auto":
        return few and m == 8
    return mode


def bd_rows_cfg(tune: dict) -> int:
    """Pipeline stages (``TUNE['rows_ns']``, default 16)."""
    ns = tune.get("rows_ns", 16)
    if not isinstance(ns, int) or ns < 1:
        raise ValueError(f"TUNE['rows_ns'] must be a positive int, got {ns!r}")
    return ns


def bd_rows_forward(A, b, h0, cu, h, final, tune):
    """One launch writing ``h (B, T, H, m)`` and ``final (nseq, H, m)`` (fp32) in place; ``A (B,
    T, H, m, m)``, ``b (B, T, H, m)``, ``h0 (nseq, H, m)`` or None, ``cu`` int64 offsets or None
    (then ``B == 1``)."""
    B, T, H, m = b.shape
    if m not in (4, 8, 16):
        raise ValueError(f"bd_rows_forward needs m in (4, 8, 16), got m = {m}")
    nseq = B if cu is None else cu.numel() - 1
    grid = (triton.cdiv(H, 32 // m), nseq)
    if nseq and H:
        _bd_fwd_rows[grid](A, b, h, h0 if h0 is not None else b, final, cu if cu is not None else b,
                           T, H, M=m, NS=bd_rows_cfg(tune), HAS_INIT=h0 is not None, STORE_FINAL=True,
                           VARLEN=cu is not None, num_warps=1)
    return h, final
