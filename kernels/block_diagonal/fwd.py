"""Forward kernels: sequential register-resident recurrences over a time range.

Layout: time is flattened to ``B*T`` rows (``B == 1`` with ``cu_seqlens``); one time row of ``A``
holds ``H*m*m`` contiguous elements, one row of ``b``/``h`` holds ``H*m``. A program owns ``BH``
blocks of one sequence and one time chunk ``[t0, t1)`` and walks it step by step. The loads of
later steps do not depend on the state, so they can be issued early: ``_bd_fwd_kernel_g4`` loads
the next group of 4 steps before computing the current one (on an H200 Triton's pipeliner did
not prefetch the one-step loop: ``num_stages`` 3 and 6 timed the same). Time offsets are int64.

* ``_bd_fwd_kernel`` / ``_bd_fwd_kernel_g4``: h_t = A_t h_{t-1} + b_t, state from ``Init[s, c]``
  (chunk carry or h0); one step per iteration, or hand-pipelined groups of 4 steps (the default).
* ``_bd_summary_kernel``: per chunk, the product ``P = A_{t1-1} ... A_{t0}`` and the local end
  state ``E`` (zero start), carried together as the columns of ``S = [P | E]``.
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
    hb = pid_h * BH + tl.arange(0, BH)
    i = tl.arange(0, MP)
    mask_s = (hb < H)[:, None] & (i < M)[None, :]
    offs_s = hb[:, None] * M + i[None, :]
    offs_a = hb[:, None, None] * (M * M) + i[None, :, None] * M + i[None, None, :]
    mask_a = mask_s[:, :, None] & (i < M)[None, None, :]
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
    hb = pid_h * BH + tl.arange(0, BH)
    i = tl.arange(0, MP)
    mask_s = (hb < H)[:, None] & (i < M)[None, :]
    offs_s = hb[:, None] * M + i[None, :]
    offs_a = hb[:, None, None] * (M * M) + i[None, :, None] * M + i[None, None, :]
    mask_a = mask_s[:, :, None] & (i < M)[None, None, :]
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
                     VARLEN: tl.constexpr):
    """``h_t = a_t h_{t-1} + b_t`` on ``(BT, BN)`` tiles: an in-tile associative scan over time
    composed with the carried state; ``STORE_P`` also writes the chunk's product of ``a``."""
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    n = pid_n * BN + tl.arange(0, BN)
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
