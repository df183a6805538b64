"""Forward for blocks (``m = 2, 4, 8, 16, 32``) with the step chain halved: steps taken in pairs.

    h_{t+1} = A_{t+1} A_t h_{t-1} + (A_{t+1} b_t + b_{t+1}) = M_t h_{t-1} + c_t

``M_t`` and ``c_t`` do not depend on the state, so they are computed off the chain, and the chain
from one pair to the next is one mat-vec and one exchange of the state between lanes, where the
ring (``fwd._bd_fwd_ring``) has two. ``h_t`` itself, ``A_t h_{t-1} + b_t``, also leaves the chain:
it is stored, never fed back. Why: with few programs an SM (B8 T2048 N768, m = 8: one warp on each
of about 3 of an SM's 4 schedulers) the ring issues on 31 % of its cycles, each warp waiting on its
own step chain (Nsight Compute, RESULTS.md "fifty-first"); the product ``M_t`` costs ``m^3``
multiply-adds a block and pair, but they are independent of each other and of the chain.

Layout: the ring's ``GATHER`` layout (a block row per tensor row ``r``, ``(BH * m, m)`` tiles, the
row sums in-warp, the state back to the lanes by ``tl.gather``). Row ``r`` of ``M_t`` is
``sum_j A_{t+1}[r, j] A_t[j, :]``: the rows ``A_t[j, :]`` of the block and the entries
``A_{t+1}[r, j]`` are loaded again where they are used; the ring loaded the same bytes ``2D``
steps earlier, so the loads hit L1 and DRAM sees each byte once. A ring of ``D`` pair slots keeps
``2D - 2`` steps of loads in flight.
"""
import triton
import triton.language as tl

from .fwd import _ring_ld, _seq_bounds


@triton.jit
def _pair_ld(A, Bv, t, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM):
    a0, b0 = _ring_ld(A, Bv, t, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    a1, b1 = _ring_ld(A, Bv, t + 1, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    return a0, b0, a1, b1


@triton.jit
def _pair_step(A, Bv, Hout, a0, b0, a1, b1, x, t, t1, tn, offs_a, offs_s, mask_a, mask_s, offs_x,
               offs_blk, idx, HM, HMM, M: tl.constexpr, STORE_H: tl.constexpr):
    """Steps ``t`` and ``t + 1`` from the slot ``(a0, b0, a1, b1)`` and the state ``x`` (``h_{t-1}``
    broadcast along rows), then the slot refilled with steps ``tn``, ``tn + 1``."""
    ok0 = t < t1
    ok1 = t + 1 < t1
    # off the chain: M = A_{t+1} A_t (row r: sum over j of A_{t+1}[r, j] * row j of A_t's block)
    # and c = A_{t+1} b_t + b_{t+1}, from re-reads of bytes the ring loaded 2D steps ago. Past the
    # chunk's end they read step t1 - 1 instead (in bounds; the results are then discarded), so
    # they need no time mask: fewer selects and predicates a step
    tc0 = tl.minimum(t, t1 - 1)
    pa0 = A + tc0 * HMM
    a1f = a1.to(tl.float32)
    jj = tl.arange(0, M)[None, :]
    mm = tl.zeros(a0.shape, dtype=tl.float32)
    for j in tl.static_range(M):
        # A_{t+1}[r, j] for every lane of row r: the other columns are -0.0, which the compiler
        # drops from the in-lane sum (x + -0.0 == x exactly), so this is one shuffle across the
        # row's lanes; a load of the entry instead went through a change of layout (2 shuffles
        # and 4 selects an element, sm_90a SASS)
        a1j = tl.sum(tl.where(jj == j, a1f, -0.0), axis=1)[:, None]
        a0j = tl.load(pa0 + offs_blk + j * M, mask=mask_a, other=0.0).to(tl.float32)
        mm += a1j * a0j
    b0x = tl.load(Bv + tc0 * HM + offs_x, mask=mask_a, other=0.0).to(tl.float32)
    c = tl.sum(a1f * b0x, axis=1) + b1.to(tl.float32)
    h0 = tl.sum(a0.to(tl.float32) * x, axis=1) + b0.to(tl.float32)  # h_t: stored, not fed back
    h1 = tl.sum(mm * x, axis=1) + c  # h_{t+1}: the chain
    if STORE_H:
        tl.store(Hout + t * HM + offs_s, h0.to(Hout.dtype.element_ty), mask=tl.where(ok0, mask_s, False))
        tl.store(Hout + (t + 1) * HM + offs_s, h1.to(Hout.dtype.element_ty),
                 mask=tl.where(ok1, mask_s, False))
    xn = tl.where(ok1, h1, h0)
    xn = tl.gather(tl.broadcast_to(xn[:, None], a0.shape), idx, 0)
    x = tl.where(ok0, xn, x)
    a0, b0, a1, b1 = _pair_ld(A, Bv, tn, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    return x, a0, b0, a1, b1


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_fwd_pair(A, Bv, Hout, Init, Final, CU, T, H, CHUNK, NC,
                 M: tl.constexpr, BH: tl.constexpr, D: tl.constexpr, HAS_INIT: tl.constexpr,
                 STORE_H: tl.constexpr, STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t`` over the chunk ``(program_id(1), program_id(2))`` for the blocks
    ``program_id(0) * BH ..`` in pairs of steps (module docstring); ``D`` pair slots (2, 4 or 8).
    The arguments are ``fwd._bd_fwd_ring``'s; ``M`` a power of two."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    r = tl.arange(0, BH * M)
    j = tl.arange(0, M)
    mask_s = pid_h * BH + r // M < H
    offs_s = pid_h * (BH * M) + r
    offs_a = offs_s[:, None] * M + j[None, :]
    mask_a = mask_s[:, None] & (j < M)[None, :]
    idx = ((r // M) * M)[:, None] + j[None, :]
    offs_x = pid_h * (BH * M) + idx  # h(block(r))[j] within a time row of b / h
    offs_blk = ((pid_h * BH + r // M) * (M * M))[:, None] + j[None, :]  # row 0 of block(r) in A
    HM = H * M
    HMM = HM * M
    sc = s.to(tl.int64) * NC + c
    if HAS_INIT:
        x = tl.load(Init + sc * HM + offs_x, mask=mask_a, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BH * M, M], dtype=tl.float32)
    a0, b0, a1, b1 = _pair_ld(A, Bv, t0, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    a2, b2, a3, b3 = _pair_ld(A, Bv, t0 + 2, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    if D >= 4:
        a4, b4, a5, b5 = _pair_ld(A, Bv, t0 + 4, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a6, b6, a7, b7 = _pair_ld(A, Bv, t0 + 6, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    if D >= 8:
        a8, b8, a9, b9 = _pair_ld(A, Bv, t0 + 8, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a10, b10, a11, b11 = _pair_ld(A, Bv, t0 + 10, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a12, b12, a13, b13 = _pair_ld(A, Bv, t0 + 12, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a14, b14, a15, b15 = _pair_ld(A, Bv, t0 + 14, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    S = 2 * D  # steps a trip
    for ts in range(t0, t1, S):
        x, a0, b0, a1, b1 = _pair_step(A, Bv, Hout, a0, b0, a1, b1, x, ts, t1, ts + S, offs_a, offs_s,
                                       mask_a, mask_s, offs_x, offs_blk, idx, HM, HMM, M, STORE_H)
        x, a2, b2, a3, b3 = _pair_step(A, Bv, Hout, a2, b2, a3, b3, x, ts + 2, t1, ts + S + 2, offs_a,
                                       offs_s, mask_a, mask_s, offs_x, offs_blk, idx, HM, HMM, M, STORE_H)
        if D >= 4:
            x, a4, b4, a5, b5 = _pair_step(A, Bv, Hout, a4, b4, a5, b5, x, ts + 4, t1, ts + S + 4, offs_a,
                                           offs_s, mask_a, mask_s, offs_x, offs_blk, idx, HM, HMM, M,
                                           STORE_H)
            x, a6, b6, a7, b7 = _pair_step(A, Bv, Hout, a6, b6, a7, b7, x, ts + 6, t1, ts + S + 6, offs_a,
                                           offs_s, mask_a, mask_s, offs_x, offs_blk, idx, HM, HMM, M,
                                           STORE_H)
        if D >= 8:
            x, a8, b8, a9, b9 = _pair_step(A, Bv, Hout, a8, b8, a9, b9, x, ts + 8, t1, ts + S + 8, offs_a,
                                           offs_s, mask_a, mask_s, offs_x, offs_blk, idx, HM, HMM, M,
                                           STORE_H)
            x, a10, b10, a11, b11 = _pair_step(A, Bv, Hout, a10, b10, a11, b11, x, ts + 10, t1,
                                               ts + S + 10, offs_a, offs_s, mask_a, mask_s, offs_x,
                                               offs_blk, idx, HM, HMM, M, STORE_H)
            x, a12, b12, a13, b13 = _pair_step(A, Bv, Hout, a12, b12, a13, b13, x, ts + 12, t1,
                                               ts + S + 12, offs_a, offs_s, mask_a, mask_s, offs_x,
                                               offs_blk, idx, HM, HMM, M, STORE_H)
            x, a14, b14, a15, b15 = _pair_step(A, Bv, Hout, a14, b14, a15, b15, x, ts + 14, t1,
                                               ts + S + 14, offs_a, offs_s, mask_a, mask_s, offs_x,
                                               offs_blk, idx, HM, HMM, M, STORE_H)
    if STORE_FINAL:  # the block's first row holds its state
        tl.store(Final + sc * HM + offs_x, x, mask=mask_a & ((r % M) == 0)[:, None])
