"""The ``m = 4`` forward with every block in one thread's registers: no exchange of the state.

Why: in the ring kernels a thread owns one row of a 4 x 4 block (one 16-byte vector of ``A``), so
each step's new state must reach the block's other three threads: in the sm_90a code of
``_bd_fwd_ring`` (Triton 3.6) every step runs ``stmatrix``, ``bar.sync`` and ``ld.shared`` between
one step's FMAs and the next, and at B8 T2048 N768 (192 one-warp programs) that chain, not DRAM,
sets the time: 0.148 ms for 2048 steps, while B16 T1024 (same bytes, half the steps) reaches 93 %
of a copy (RESULTS.md, twentieth session). Here ``A`` is loaded row by row as ``(BH, 1, 4)``
tensors (a thread holds one block's row: a 16-byte vector), split into 16 ``(BH, 1)`` entries
in-thread, and the state is 4 ``(BH, 1)`` tensors in the same layout, so a step is 16 FMAs with
a dependent chain of 4 and no shared memory. The loads do not depend on the state;
``tl.range(..., num_stages=NS)`` turns them into asynchronous copies ``NS - 1`` steps ahead
(shared memory holds them, so registers do not).
"""
import triton
import triton.language as tl

from .fwd import _seq_bounds
from .lookback2_bwd import _split4

__all__ = ["_bd4_fwd_rows", "rows4_launch"]


@triton.jit
def _join4(x0, x1, x2, x3, BH: tl.constexpr):
    """Four ``(BH, 1)`` tensors -> ``(BH, 1, 4)`` with ``[..., k] = x_k`` (``_split4``'s inverse)."""
    return tl.reshape(tl.join(tl.join(x0, x2), tl.join(x1, x3)), (BH, 1, 4))


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd4_fwd_rows(A, Bv, Hout, Init, Final, CU, T, H, CHUNK, NC,
                  BH: tl.constexpr, NS: tl.constexpr, HAS_INIT: tl.constexpr, STORE_H: tl.constexpr,
                  STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t`` over ``[t0, t1)`` of chunk ``program_id(2)`` for ``BH`` blocks,
    ``_bd_fwd_kernel``'s contract with ``M = 4``: ``A (rows, H, 4, 4)``, ``b``/``h (rows, H, 4)``
    (rows = ``B*T``; ``B == 1`` with ``CU``), state from ``Init[s, c]``, end state to
    ``Final[s, c]`` (both ``(nseq, NC, H, 4)``, fp32)."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    hb = pid_h * BH + tl.arange(0, BH)
    k4 = tl.arange(0, 4)
    mask = ((hb < H)[:, None] & (k4 < 4)[None, :])[:, None, :]      # (BH, 1, 4)
    offs_row = (hb[:, None] * 16 + k4[None, :])[:, None, :]          # row 0 of each block
    offs_s = (hb[:, None] * 4 + k4[None, :])[:, None, :]
    HM = H * 4
    HMM = HM * 4
    sc = (s.to(tl.int64) * NC + c) * HM
    if HAS_INIT:
        x0, x1, x2, x3 = _split4(tl.load(Init + sc + offs_s, mask=mask, other=0.0).to(tl.float32), BH, 1)
    else:
        x0 = tl.zeros([BH, 1], dtype=tl.float32)
        x1 = tl.zeros([BH, 1], dtype=tl.float32)
        x2 = tl.zeros([BH, 1], dtype=tl.float32)
        x3 = tl.zeros([BH, 1], dtype=tl.float32)
    for t in tl.range(t0, t1, num_stages=NS):
        pa = A + t * HMM + offs_row
        a00, a01, a02, a03 = _split4(tl.load(pa, mask=mask, other=0.0).to(tl.float32), BH, 1)
        a10, a11, a12, a13 = _split4(tl.load(pa + 4, mask=mask, other=0.0).to(tl.float32), BH, 1)
        a20, a21, a22, a23 = _split4(tl.load(pa + 8, mask=mask, other=0.0).to(tl.float32), BH, 1)
        a30, a31, a32, a33 = _split4(tl.load(pa + 12, mask=mask, other=0.0).to(tl.float32), BH, 1)
        b0, b1, b2, b3 = _split4(tl.load(Bv + t * HM + offs_s, mask=mask, other=0.0).to(tl.float32), BH, 1)
        y0 = b0 + a00 * x0 + a01 * x1 + a02 * x2 + a03 * x3
        y1 = b1 + a10 * x0 + a11 * x1 + a12 * x2 + a13 * x3
        y2 = b2 + a20 * x0 + a21 * x1 + a22 * x2 + a23 * x3
        y3 = b3 + a30 * x0 + a31 * x1 + a32 * x2 + a33 * x3
        x0, x1, x2, x3 = y0, y1, y2, y3
        if STORE_H:
            tl.store(Hout + t * HM + offs_s, _join4(x0, x1, x2, x3, BH).to(Hout.dtype.element_ty), mask=mask)
    if STORE_FINAL:
        tl.store(Final + sc + offs_s, _join4(x0, x1, x2, x3, BH), mask=mask)


def rows4_launch(grid_sc, A, b, h, init, final, cu, T, H, CHUNK, NC, tune, *, HAS_INIT, STORE_H,
                 STORE_FINAL, VARLEN, num_warps=None):
    """Launch ``_bd4_fwd_rows`` over ``grid_sc = (nseq, NC)`` with ``TUNE`` keys ``rows_bh``
    (blocks a program, default 8: as many programs as the ring kernels), ``rows_ns`` (pipeline
    stages, 16) and ``rows_nw`` (warps, 1); ``num_warps`` (the ring's) is ignored."""
    bh, ns = tune.get("rows_bh", 8), tune.get("rows_ns", 16)
    if bh < 1 or bh & (bh - 1):
        raise ValueError(f"TUNE['rows_bh'] must be a power of two, got {bh}")
    _bd4_fwd_rows[(triton.cdiv(H, bh),) + tuple(grid_sc)](
        A, b, h, init, final, cu, T, H, CHUNK, NC, BH=bh, NS=ns, HAS_INIT=HAS_INIT, STORE_H=STORE_H,
        STORE_FINAL=STORE_FINAL, VARLEN=VARLEN, num_warps=tune.get("rows_nw", 1))
