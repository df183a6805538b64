"""Forward kernels: sequential register-resident recurrences over a time range.

Layout: time is flattened to ``B*T`` rows (``B == 1`` with ``cu_seqlens``); one time row of ``A``
holds ``H*m*m`` contiguous elements, one row of ``b``/``h`` holds ``H*m``. A program owns ``BH``
blocks of one sequence and one time chunk ``[t0, t1)`` and walks it step by step. The loads of
later steps do not depend on the state, so they can be issued early: ``_bd_fwd_kernel_g4`` loads
the next group of 4 steps before computing the current one (on an H200 Triton's pipeliner did
not prefetch the one-step loop: ``num_stages`` 3 and 6 timed the same). Time offsets are int64.

* ``_bd_fwd_ring`` (the default), ``_bd_fwd_kernel_g4``, ``_bd_fwd_kernel``:
  h_t = A_t h_{t-1} + b_t, state from ``Init[s, c]`` (chunk carry or h0); a ring of ``4R``
  in-flight steps with vectorised loads, hand-pipelined groups of 4 steps, one step per iteration.
  ``_bd_fwd_ring`` with ``SUMMARY`` also computes chunk summaries, one column of ``[P | E]`` per
  program; with ``GATHER`` (the default at ``m = 3, 5..8``, ``shuffles.ring_gather``; padded rows
  below a power of two) the new state goes back to the lanes by warp shuffles (``tl.gather``)
  instead of through shared memory.
* ``_bd_summary_kernel``: per chunk, the product ``P = A_{t1-1} ... A_{t0}`` and the local end
  state ``E`` (zero start), carried together as the columns of ``S = [P | E]`` in one program.
* ``_diag_fwd_kernel``: the m = 1 case on ``(BT, BN)`` tiles with ``tl.associative_scan`` over time.
"""
import triton
import triton.language as tl


@triton.jit
def _seq_bounds(CU, s, c, T, CHUNK, VARLEN: tl.constexpr):
    if VARLEN:
        bos = tl.load(CU + s).to(tl.int64)
        eos = tl.load(CU + s + 1).to(tl.int64)
    else:
        bos = s.to(tl.int64) * T
        eos = bos + T
    t0 = bos + c.to(tl.int64) * CHUNK
    t1 = tl.minimum(t0 + CHUNK, eos)
    return bos, eos, t0, t1


@triton.jit
def _block_offsets(pid_h, H, M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr):
    """Blocks ``pid_h * BH ..`` of one time step (``m`` padded to ``MP``): state offsets/mask
    ``(BH, MP)`` and ``A`` offsets/mask ``(BH, MP, MP)`` (row ``i``, column ``j`` at ``i * M + j``)."""
    hb = pid_h * BH + tl.arange(0, BH)
    i = tl.arange(0, MP)
    mask_s = (hb < H)[:, None] & (i < M)[None, :]
    offs_s = hb[:, None] * M + i[None, :]
    offs_a = hb[:, None, None] * (M * M) + i[None, :, None] * M + i[None, None, :]
    mask_a = mask_s[:, :, None] & (i < M)[None, None, :]
    return offs_s, mask_s, offs_a, mask_a


@triton.jit
def _block_row_offsets(pid_h, H, M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr):
    """As ``_block_offsets`` but ``A`` as ``(BH, MP * MP)`` rows, reshaped in registers by the
    caller: with ``M == MP`` one contiguous row per block (16-byte vector loads, no 3-D mask)."""
    hb = pid_h * BH + tl.arange(0, BH)
    i = tl.arange(0, MP)
    k = tl.arange(0, MP * MP)
    mh = hb < H
    mask_s = mh[:, None] & (i < M)[None, :]
    offs_s = hb[:, None] * M + i[None, :]
    if M == MP:
        offs_a = hb[:, None] * (M * M) + k[None, :]
        mask_a = mh[:, None] & (k < M * M)[None, :]
    else:
        offs_a = hb[:, None] * (M * M) + ((k // MP) * M + k % MP)[None, :]
        mask_a = mh[:, None] & ((k // MP < M) & (k % MP < M))[None, :]
    return offs_s, mask_s, offs_a, mask_a


@triton.jit
def _padded_rows(pid_h, H, M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr):
    """Rows of the kernels by shuffles (the ring's ``GATHER``, ``bwd._bd_bwd_gather``): row ``r``
    is element ``r % MP`` of block ``blk = pid_h * BH + r // MP`` (rows ``r % MP >= M`` are padding
    below a power of two). Returns ``r``, ``j = arange(MP)``, ``blk``, the state's offsets / mask
    ``(BH * MP,)`` within a time row, and ``idx[r, i] = MP * (r // MP) + i`` for ``tl.gather``."""
    r = tl.arange(0, BH * MP)
    j = tl.arange(0, MP)
    blk = pid_h * BH + r // MP
    if M == MP:  # spelled so that the compiler sees contiguous rows (16-byte accesses)
        mask_s = blk < H
        offs_s = pid_h * (BH * M) + r
    else:
        mask_s = (blk < H) & (r % MP < M)
        offs_s = blk * M + r % MP
    idx = ((r // MP) * MP)[:, None] + j[None, :]
    return r, j, blk, offs_s, mask_s, idx


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_fwd_kernel(A, Bv, Hout, Init, Final, CU, T, H, CHUNK, NC,
                   M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, NS: tl.constexpr,
                   HAS_INIT: tl.constexpr, STORE_H: tl.constexpr, STORE_FINAL: tl.constexpr,
                   VARLEN: tl.constexpr):
    """One step per iteration; ``tl.range(..., num_stages=NS)`` asks the pipeliner to prefetch."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    offs_s, mask_s, offs_a, mask_a = _block_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    sc = (s.to(tl.int64) * NC + c) * HM
    if HAS_INIT:
        x = tl.load(Init + sc + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BH, MP], dtype=tl.float32)
    for t in tl.range(t0, t1, num_stages=NS):
        a = tl.load(A + t * HMM + offs_a, mask=mask_a, other=0.0).to(tl.float32)
        bt = tl.load(Bv + t * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32)
        x = tl.sum(a * x[:, None, :], axis=2) + bt
        if STORE_H:
            tl.store(Hout + t * HM + offs_s, x.to(Hout.dtype.element_ty), mask=mask_s)
    if STORE_FINAL:
        tl.store(Final + sc + offs_s, x, mask=mask_s)


@triton.jit
def _step(a, bt, x, t, t1):
    xn = tl.sum(a.to(tl.float32) * x[:, None, :], axis=2) + bt.to(tl.float32)
    return tl.where(t < t1, xn, x)


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_fwd_kernel_g4(A, Bv, Hout, Init, Final, CU, T, H, CHUNK, NC,
                      M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr,
                      HAS_INIT: tl.constexpr, STORE_H: tl.constexpr, STORE_FINAL: tl.constexpr,
                      VARLEN: tl.constexpr):
    """Hand-pipelined: steps in groups of 4; the next group's 4 loads of A and b are issued
    before the current group is computed (8 steps of loads in flight, no reliance on the
    compiler's pipeliner, which cannot move loads above the stores of h by itself)."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    offs_s, mask_s, offs_a, mask_a = _block_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    sc = (s.to(tl.int64) * NC + c) * HM
    if HAS_INIT:
        x = tl.load(Init + sc + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BH, MP], dtype=tl.float32)
    z = 0 * offs_s
    za = 0 * offs_a
    pa = A + t0 * HMM + offs_a
    pb = Bv + t0 * HM + offs_s
    a0 = tl.load(pa, mask=mask_a & ((t0 + za) < t1), other=0.0)
    a1 = tl.load(pa + HMM, mask=mask_a & ((t0 + 1 + za) < t1), other=0.0)
    a2 = tl.load(pa + 2 * HMM, mask=mask_a & ((t0 + 2 + za) < t1), other=0.0)
    a3 = tl.load(pa + 3 * HMM, mask=mask_a & ((t0 + 3 + za) < t1), other=0.0)
    b0 = tl.load(pb, mask=mask_s & ((t0 + z) < t1), other=0.0)
    b1 = tl.load(pb + HM, mask=mask_s & ((t0 + 1 + z) < t1), other=0.0)
    b2 = tl.load(pb + 2 * HM, mask=mask_s & ((t0 + 2 + z) < t1), other=0.0)
    b3 = tl.load(pb + 3 * HM, mask=mask_s & ((t0 + 3 + z) < t1), other=0.0)
    for ts in range(t0, t1, 4):
        tn = ts + 4
        pa = A + tn * HMM + offs_a
        pb = Bv + tn * HM + offs_s
        n0 = tl.load(pa, mask=mask_a & ((tn + za) < t1), other=0.0)
        n1 = tl.load(pa + HMM, mask=mask_a & ((tn + 1 + za) < t1), other=0.0)
        n2 = tl.load(pa + 2 * HMM, mask=mask_a & ((tn + 2 + za) < t1), other=0.0)
        n3 = tl.load(pa + 3 * HMM, mask=mask_a & ((tn + 3 + za) < t1), other=0.0)
        m0 = tl.load(pb, mask=mask_s & ((tn + z) < t1), other=0.0)
        m1 = tl.load(pb + HM, mask=mask_s & ((tn + 1 + z) < t1), other=0.0)
        m2 = tl.load(pb + 2 * HM, mask=mask_s & ((tn + 2 + z) < t1), other=0.0)
        m3 = tl.load(pb + 3 * HM, mask=mask_s & ((tn + 3 + z) < t1), other=0.0)
        ph = Hout + ts * HM + offs_s
        x = _step(a0, b0, x, ts, t1)
        if STORE_H:
            tl.store(ph, x.to(Hout.dtype.element_ty), mask=mask_s & ((ts + z) < t1))
        x = _step(a1, b1, x, ts + 1, t1)
        if STORE_H:
            tl.store(ph + HM, x.to(Hout.dtype.element_ty), mask=mask_s & ((ts + 1 + z) < t1))
        x = _step(a2, b2, x, ts + 2, t1)
        if STORE_H:
            tl.store(ph + 2 * HM, x.to(Hout.dtype.element_ty), mask=mask_s & ((ts + 2 + z) < t1))
        x = _step(a3, b3, x, ts + 3, t1)
        if STORE_H:
            tl.store(ph + 3 * HM, x.to(Hout.dtype.element_ty), mask=mask_s & ((ts + 3 + z) < t1))
        a0, a1, a2, a3 = n0, n1, n2, n3
        b0, b1, b2, b3 = m0, m1, m2, m3
    if STORE_FINAL:
        tl.store(Final + sc + offs_s, x, mask=mask_s)


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_summary_kernel(A, Bv, Pout, Eout, CU, T, H, CHUNK, NC,
                       M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, NCB: tl.constexpr,
                       NGRP: tl.constexpr, NS: tl.constexpr, VARLEN: tl.constexpr):
    """Columns ``col < M`` of S start as the identity and give P; column ``col == M`` starts at 0,
    receives ``b`` and gives E. Column groups of ``NCB`` are spread over ``program_id(0)``."""
    pid = tl.program_id(0)
    pid_h = pid // NGRP
    grp = pid % NGRP
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    hb = pid_h * BH + tl.arange(0, BH)
    i = tl.arange(0, MP)
    col = grp * NCB + tl.arange(0, NCB)
    mh = hb < H
    mask_s = mh[:, None] & (i < M)[None, :]
    offs_s = hb[:, None] * M + i[None, :]
    offs_a = hb[:, None, None] * (M * M) + i[None, :, None] * M + i[None, None, :]
    mask_a = mask_s[:, :, None] & (i < M)[None, None, :]
    HM = H * M
    HMM = HM * M
    # S[h, i, n]: row i of column col[n]
    eye = (i[:, None] == col[None, :]).to(tl.float32)
    S = tl.zeros([BH, MP, NCB], dtype=tl.float32) + eye[None, :, :]
    is_e = (col == M).to(tl.float32)
    for t in tl.range(t0, t1, num_stages=NS):
        a = tl.load(A + t * HMM + offs_a, mask=mask_a, other=0.0).to(tl.float32)
        bt = tl.load(Bv + t * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32)
        S = tl.sum(a[:, :, :, None] * S[:, None, :, :], axis=2) + bt[:, :, None] * is_e[None, None, :]
    sc = s.to(tl.int64) * NC + c
    # P: (nseq, NC, H, M, M), element [h, i, col]
    offs_p = hb[:, None, None] * (M * M) + i[None, :, None] * M + col[None, None, :]
    mask_p = mask_s[:, :, None] & (col < M)[None, None, :]
    tl.store(Pout + sc * HMM + offs_p, S, mask=mask_p)
    offs_e = hb[:, None, None] * M + i[None, :, None] + 0 * col[None, None, :]
    mask_e = mask_s[:, :, None] & (col == M)[None, None, :]
    tl.store(Eout + sc * HM + offs_e, S, mask=mask_e)


@triton.jit
def _affine_combine(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _diag_fwd_kernel(Aa, Bv, Hout, Init, Final, Pout, CU, T, N, CHUNK, NC,
                     BT: tl.constexpr, BN: tl.constexpr, HAS_INIT: tl.constexpr,
                     STORE_H: tl.constexpr, STORE_FINAL: tl.constexpr, STORE_P: tl.constexpr,
                     VARLEN: tl.constexpr, NV: tl.constexpr = 1, VEC: tl.constexpr = 0):
    """``h_t = a_t h_{t-1} + b_t`` on ``(BT, BN)`` tiles: an in-tile associative scan over time
    composed with the carried state; ``STORE_P`` also writes the chunk's product of ``a``.
    ``NV``: a power of two dividing ``N`` (``_host.row_divisor``). ``VEC`` > 0 caps the channels
    a lane loads at once (``_host.diag_vec``: 4 for 16-bit inputs, which otherwise get 8 a lane and
    so more lanes along time: 210 shuffles a 32 x 64 tile against fp32's 134; Triton 3.6 PTX)."""
    N = (N // NV) * NV  # the same N, proven NV-aligned: 16-byte loads where N % 16 != 0
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    n = pid_n * BN + tl.arange(0, BN)
    if VEC > 0:
        n = tl.max_contiguous(n, VEC)  # the vector width follows the proven contiguity
    mn = n < N
    r = tl.arange(0, BT)
    last = (r == BT - 1)[:, None]
    sc = (s.to(tl.int64) * NC + c) * N
    if HAS_INIT:
        x = tl.load(Init + sc + n, mask=mn, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BN], dtype=tl.float32)
    p = tl.full([BN], 1.0, tl.float32)
    offs0 = r[:, None] * N + n[None, :]
    a_nxt = tl.load(Aa + t0 * N + offs0, mask=((t0 + r) < t1)[:, None] & mn[None, :], other=1.0)
    b_nxt = tl.load(Bv + t0 * N + offs0, mask=((t0 + r) < t1)[:, None] & mn[None, :], other=0.0)
    for ts in range(t0, t1, BT):
        t = ts + r
        m2 = (t < t1)[:, None] & mn[None, :]
        offs = ts * N + offs0
        av = a_nxt.to(tl.float32)
        bv = b_nxt.to(tl.float32)
        m3 = ((t + BT) < t1)[:, None] & mn[None, :]
        a_nxt = tl.load(Aa + offs + BT * N, mask=m3, other=1.0)
        b_nxt = tl.load(Bv + offs + BT * N, mask=m3, other=0.0)
        ca, cb = tl.associative_scan((av, bv), 0, _affine_combine)
        hv = ca * x[None, :] + cb
        if STORE_H:
            tl.store(Hout + offs, hv.to(Hout.dtype.element_ty), mask=m2)
        x = tl.sum(tl.where(last, hv, 0.0), axis=0)
        if STORE_P:
            p = p * tl.sum(tl.where(last, ca, 0.0), axis=0)
    if STORE_FINAL:
        tl.store(Final + sc + n, x, mask=mn)
    if STORE_P:
        tl.store(Pout + sc + n, p, mask=mn)


# ----------------------------------------------------------------------------- ring kernel
@triton.jit
def _ring_ld(A, Bv, t, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM):
    """Loads step ``t`` (all-zero past ``t1``); the time mask is a scalar so that it does not
    break the vectorisation of the (contiguous) block loads."""
    ok = t < t1  # tl.where, not ``&``: the interpreter rejects ``tensor & scalar`` masks (varlen)
    a = tl.load(A + t * HMM + offs_a, mask=tl.where(ok, mask_a, False), other=0.0)
    b = tl.load(Bv + t * HM + offs_s, mask=tl.where(ok, mask_s, False), other=0.0)
    return a, b


@triton.jit
def _ring_step(A, Bv, Hout, a, b, x, t, t1, tn, offs_a, offs_s, mask_a, mask_s, HM, HMM, bscale, idx,
               MP: tl.constexpr, BH: tl.constexpr, STORE_H: tl.constexpr, GATHER: tl.constexpr):
    """Step ``t`` with the slot ``(a, b)``, then refill the slot with step ``tn``. ``GATHER``:
    ``a`` is ``(BH * MP, MP)`` (a block row per tensor row), ``b`` and ``offs_s`` ``(BH * MP,)``,
    and ``x`` is the state broadcast along rows (``x[r, j] = h[block(r), j]``), rebuilt from the
    row sums by ``tl.gather`` along the rows (``idx[r, j] = MP * block(r) + j``): Triton 3.6
    lowers it to ``shfl.idx`` where the rows of a block share a warp (``_bd_fwd_ring``)."""
    if GATHER:
        xn = tl.sum(a.to(tl.float32) * x, axis=1) + b.to(tl.float32)
    else:
        xn = tl.sum(tl.reshape(a.to(tl.float32), (BH, MP, MP)) * x[:, None, :], axis=2) + b.to(tl.float32) * bscale
    if STORE_H:
        tl.store(Hout + t * HM + offs_s, xn.to(Hout.dtype.element_ty), mask=tl.where(t < t1, mask_s, False))
    if GATHER:  # the row sums back to every lane of their block
        xn = tl.gather(tl.broadcast_to(xn[:, None], (BH * MP, MP)), idx, 0)
    x = tl.where(t < t1, xn, x)
    a, b = _ring_ld(A, Bv, tn, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    return x, a, b


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_fwd_ring(A, Bv, Hout, Init, Final, Pout, CU, T, H, CHUNK, NC,
                 M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, R: tl.constexpr,
                 SUMMARY: tl.constexpr, HAS_INIT: tl.constexpr, STORE_H: tl.constexpr,
                 STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr, GATHER: tl.constexpr = False):
    """Software-pipelined ring: ``4R`` slots, each refilled with step ``t + 4R`` right after step
    ``t`` used it, so ``4R - 1`` steps of loads stay in flight (``_bd_fwd_kernel_g4`` oscillates
    between 4 and 8). ``A`` is loaded as ``(BH, MP*MP)`` rows, contiguous when ``M == MP``: 16-byte
    vectors, and for ``m <= 2`` one thread owns whole blocks (no cross-thread exchange of ``x``).

    ``SUMMARY``: chunk summaries ``S = [P | E]`` one column per program (``program_id(0)`` runs
    over block groups x ``M + 1`` columns): column ``col < M`` starts at ``e_col`` without ``b``
    and gives column ``col`` of ``P`` (into ``Pout``); column ``M`` starts at 0 with ``b`` and gives
    ``E`` (into ``Final``). The ``M + 1`` programs of a block group read the same ``A`` at about
    the same time (adjacent program ids), so the repeats mostly hit L2; a matrix-state layout
    (``(BH, M, M+1)`` per program) made Triton spill and shuffle."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    if SUMMARY:
        pid_h = pid // (M + 1)
        col = pid % (M + 1)
    else:
        pid_h = pid
        col = M
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    hb = pid_h * BH + tl.arange(0, BH)  # also used by the summary mode below
    i = tl.arange(0, MP)
    offs_s, mask_s, offs_a, mask_a = _block_row_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    sc = s.to(tl.int64) * NC + c
    bscale = (col == M).to(tl.float32)
    idx = offs_s  # unused unless GATHER
    tl.static_assert(not GATHER or not SUMMARY, "GATHER needs SUMMARY off")
    if GATHER:  # rows of blocks (not SUMMARY): the sum of a row is in-warp, the state goes back
        # to the lanes by shuffles, not through shared memory (``_ring_step``). Row r is row
        # r % MP of block r // MP of the group; with M < MP the rows r % MP >= M are padding
        r, j, blk, offs_s, mask_s, idx = _padded_rows(pid_h, H, M, MP, BH)
        if M == MP:  # offs_x: h(block(r))[j] within a time row
            offs_x = (pid_h * (BH * M) + idx).to(tl.int64)
            jc = j
        else:
            offs_x = (blk[:, None] * M + j[None, :]).to(tl.int64)
            # the rows are not 16-byte aligned, so the loads are scalar; with ``j`` itself the
            # compiler lays them out along the row (4 x 8 lanes) and converts every slot through
            # shared memory to the gather's 16 x 2; the select hides the row's contiguity, so the
            # load takes 16 x 2 itself (sm_90a, Triton 3.6, ring4: m = 5 1085 -> 690 loop
            # instructions, 18 -> 0 barriers, 168 -> 100 registers). Masked columns read column 0.
            jc = tl.where(j < M, j, 0)
        offs_a = offs_s[:, None] * M + jc[None, :]
        mask_a = mask_s[:, None] & (j < M)[None, :]
        if HAS_INIT:
            x = tl.load(Init + sc * HM + offs_x, mask=mask_a, other=0.0).to(tl.float32)
        else:
            x = tl.zeros([BH * MP, MP], dtype=tl.float32)
    elif SUMMARY:
        x = tl.zeros([BH, MP], dtype=tl.float32) + (i == col).to(tl.float32)[None, :]
    elif HAS_INIT:
        x0 = tl.load(Init + sc * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32)
        # x = I x0 (a select: x0 exactly), reduced as a step reduces A x, so that the state
        # starts in the layout every step returns. Loaded as it is, the loop-carried state kept the
        # load's layout: for sm_90a (ptxas, Triton 3.6) the m = 2 ring8 kernel with an initial
        # state spilled 1164 bytes per thread (255 registers); now 239 registers, no spill, and
        # ring4 at m = 2 needs 122 registers with or without h0 (164 before). H100: B8 T2048 N768
        # m = 2 with h0 0.109 ms against 0.332 with the plain load (README)
        k = tl.arange(0, MP * MP)
        eye = (tl.zeros([BH, MP * MP], dtype=tl.int32) + ((k // MP) == (k % MP)).to(tl.int32)[None, :]) != 0
        x = tl.sum(tl.where(tl.reshape(eye, (BH, MP, MP)), x0[:, None, :], 0.0), axis=2)
    else:
        x = tl.zeros([BH, MP], dtype=tl.float32)
    D = 4 * R
    a0, b0 = _ring_ld(A, Bv, t0, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    a1, b1 = _ring_ld(A, Bv, t0 + 1, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    a2, b2 = _ring_ld(A, Bv, t0 + 2, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    a3, b3 = _ring_ld(A, Bv, t0 + 3, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    if R >= 2:
        a4, b4 = _ring_ld(A, Bv, t0 + 4, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a5, b5 = _ring_ld(A, Bv, t0 + 5, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a6, b6 = _ring_ld(A, Bv, t0 + 6, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a7, b7 = _ring_ld(A, Bv, t0 + 7, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    if R >= 4:
        a8, b8 = _ring_ld(A, Bv, t0 + 8, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a9, b9 = _ring_ld(A, Bv, t0 + 9, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a10, b10 = _ring_ld(A, Bv, t0 + 10, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a11, b11 = _ring_ld(A, Bv, t0 + 11, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a12, b12 = _ring_ld(A, Bv, t0 + 12, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a13, b13 = _ring_ld(A, Bv, t0 + 13, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a14, b14 = _ring_ld(A, Bv, t0 + 14, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a15, b15 = _ring_ld(A, Bv, t0 + 15, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    if R >= 8:  # 32 slots: for few programs (too few bytes in flight with 16)
        a16, b16 = _ring_ld(A, Bv, t0 + 16, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a17, b17 = _ring_ld(A, Bv, t0 + 17, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a18, b18 = _ring_ld(A, Bv, t0 + 18, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a19, b19 = _ring_ld(A, Bv, t0 + 19, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a20, b20 = _ring_ld(A, Bv, t0 + 20, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a21, b21 = _ring_ld(A, Bv, t0 + 21, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a22, b22 = _ring_ld(A, Bv, t0 + 22, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a23, b23 = _ring_ld(A, Bv, t0 + 23, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a24, b24 = _ring_ld(A, Bv, t0 + 24, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a25, b25 = _ring_ld(A, Bv, t0 + 25, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a26, b26 = _ring_ld(A, Bv, t0 + 26, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a27, b27 = _ring_ld(A, Bv, t0 + 27, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a28, b28 = _ring_ld(A, Bv, t0 + 28, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a29, b29 = _ring_ld(A, Bv, t0 + 29, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a30, b30 = _ring_ld(A, Bv, t0 + 30, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        a31, b31 = _ring_ld(A, Bv, t0 + 31, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    for ts in range(t0, t1, D):
        x, a0, b0 = _ring_step(A, Bv, Hout, a0, b0, x, ts + 0, t1, ts + D + 0, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
        x, a1, b1 = _ring_step(A, Bv, Hout, a1, b1, x, ts + 1, t1, ts + D + 1, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
        x, a2, b2 = _ring_step(A, Bv, Hout, a2, b2, x, ts + 2, t1, ts + D + 2, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
        x, a3, b3 = _ring_step(A, Bv, Hout, a3, b3, x, ts + 3, t1, ts + D + 3, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
        if R >= 2:
            x, a4, b4 = _ring_step(A, Bv, Hout, a4, b4, x, ts + 4, t1, ts + D + 4, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a5, b5 = _ring_step(A, Bv, Hout, a5, b5, x, ts + 5, t1, ts + D + 5, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a6, b6 = _ring_step(A, Bv, Hout, a6, b6, x, ts + 6, t1, ts + D + 6, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a7, b7 = _ring_step(A, Bv, Hout, a7, b7, x, ts + 7, t1, ts + D + 7, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
        if R >= 4:
            x, a8, b8 = _ring_step(A, Bv, Hout, a8, b8, x, ts + 8, t1, ts + D + 8, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a9, b9 = _ring_step(A, Bv, Hout, a9, b9, x, ts + 9, t1, ts + D + 9, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a10, b10 = _ring_step(A, Bv, Hout, a10, b10, x, ts + 10, t1, ts + D + 10, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a11, b11 = _ring_step(A, Bv, Hout, a11, b11, x, ts + 11, t1, ts + D + 11, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a12, b12 = _ring_step(A, Bv, Hout, a12, b12, x, ts + 12, t1, ts + D + 12, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a13, b13 = _ring_step(A, Bv, Hout, a13, b13, x, ts + 13, t1, ts + D + 13, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a14, b14 = _ring_step(A, Bv, Hout, a14, b14, x, ts + 14, t1, ts + D + 14, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a15, b15 = _ring_step(A, Bv, Hout, a15, b15, x, ts + 15, t1, ts + D + 15, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
        if R >= 8:
            x, a16, b16 = _ring_step(A, Bv, Hout, a16, b16, x, ts + 16, t1, ts + D + 16, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a17, b17 = _ring_step(A, Bv, Hout, a17, b17, x, ts + 17, t1, ts + D + 17, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a18, b18 = _ring_step(A, Bv, Hout, a18, b18, x, ts + 18, t1, ts + D + 18, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a19, b19 = _ring_step(A, Bv, Hout, a19, b19, x, ts + 19, t1, ts + D + 19, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a20, b20 = _ring_step(A, Bv, Hout, a20, b20, x, ts + 20, t1, ts + D + 20, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a21, b21 = _ring_step(A, Bv, Hout, a21, b21, x, ts + 21, t1, ts + D + 21, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a22, b22 = _ring_step(A, Bv, Hout, a22, b22, x, ts + 22, t1, ts + D + 22, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a23, b23 = _ring_step(A, Bv, Hout, a23, b23, x, ts + 23, t1, ts + D + 23, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a24, b24 = _ring_step(A, Bv, Hout, a24, b24, x, ts + 24, t1, ts + D + 24, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a25, b25 = _ring_step(A, Bv, Hout, a25, b25, x, ts + 25, t1, ts + D + 25, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a26, b26 = _ring_step(A, Bv, Hout, a26, b26, x, ts + 26, t1, ts + D + 26, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a27, b27 = _ring_step(A, Bv, Hout, a27, b27, x, ts + 27, t1, ts + D + 27, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a28, b28 = _ring_step(A, Bv, Hout, a28, b28, x, ts + 28, t1, ts + D + 28, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a29, b29 = _ring_step(A, Bv, Hout, a29, b29, x, ts + 29, t1, ts + D + 29, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a30, b30 = _ring_step(A, Bv, Hout, a30, b30, x, ts + 30, t1, ts + D + 30, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
            x, a31, b31 = _ring_step(A, Bv, Hout, a31, b31, x, ts + 31, t1, ts + D + 31, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, bscale, idx, MP, BH, STORE_H, GATHER)
    if SUMMARY:
        offs_c = (hb[:, None] * (M * M) + i[None, :] * M + col)
        if col < M:
            tl.store(Pout + sc * HMM + offs_c, x, mask=mask_s)
        else:
            tl.store(Final + sc * HM + offs_s, x, mask=mask_s)
    elif GATHER:
        if STORE_FINAL:  # the block's first row holds its state
            tl.store(Final + sc * HM + offs_x, x, mask=mask_a & ((r % MP) == 0)[:, None])
    elif STORE_FINAL:
        tl.store(Final + sc * HM + offs_s, x, mask=mask_s)
