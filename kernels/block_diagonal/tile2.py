"""m = 2 tile kernels: ``tl.associative_scan`` over time on ``(BT, BH)`` tiles of 2 x 2 blocks.

The ring kernels (``fwd._bd_fwd_ring``) walk time one step at a time, so the bytes a program has
in flight are its ring's slots; with few programs (B8 T2048 N768 m = 2: 96) that caps the
forward near 62 % of copy on an H100. Here every thread of a program loads its share of a whole
``BT``-step tile at once (the next tile prefetched), as the m = 1 tile kernel
(``fwd._diag_fwd_kernel``) does, and the recurrence inside the tile is an associative scan with
the affine combine on 2 x 2 matrices:

    (A1, b1) . (A2, b2) = (A2 A1, A2 b1 + b2)        (element 1 earlier in time)

so row ``r`` of the scan holds ``(CA_r, CB_r)`` with ``h_r = CA_r x + CB_r`` for the state ``x``
entering the tile; the last row carries into the next tile. ``A`` rows ``[p, q, r, s]`` (row-major
``[[p, q], [r, s]]``) are loaded as ``(BT, BH, 4)`` (16-byte vectors) and split in registers.

Backward (adjoint, ``bwd.py``'s conventions): tile row ``r`` is time ``top - r``, the scanned
element is ``(A_{t+1}^T, g_t)`` (identity at a chunk's last step, where the carry ``mu_in``
enters), so the same combine gives ``lam_t``; then ``db = lam``, ``dA = lam h_{t-1}^T``, and the
chunk returns ``mu_out = A_{t0}^T lam_{t0}``. Opt-in (``TUNE['variant'] = 'tile'``,
``TUNE['bwd_variant'] = 'tile'``) until measured on a GPU.
"""
import triton
import triton.language as tl

from .fwd import _seq_bounds


@triton.jit
def _mat2_combine(p1, q1, r1, s1, u1, w1, p2, q2, r2, s2, u2, w2):
    """``(A1, b1) . (A2, b2) = (A2 A1, A2 b1 + b2)`` with ``A = [[p, q], [r, s]]``, ``b = [u, w]``."""
    return (p2 * p1 + q2 * r1, p2 * q1 + q2 * s1, r2 * p1 + s2 * r1, r2 * q1 + s2 * s1,
            p2 * u1 + q2 * w1 + u2, r2 * u1 + s2 * w1 + w2)


@triton.jit
def _split4(a):
    """``(..., 4)`` rows ``[p, q, r, s]`` -> ``p, q, r, s``."""
    a = tl.reshape(a, (a.shape[0], a.shape[1], 2, 2))
    c0, c1 = tl.split(a)        # columns: c0 = [p, r], c1 = [q, s]
    p, r = tl.split(c0)
    q, s = tl.split(c1)
    return p, q, r, s


@triton.jit
def _join4(p, q, r, s):
    """Inverse of ``_split4``: ``(..., 4)`` rows ``[p, q, r, s]``."""
    a = tl.join(tl.join(p, r), tl.join(q, s))
    return tl.reshape(a, (p.shape[0], p.shape[1], 4))


@triton.jit
def _tile_offsets(pid_h, H, BT: tl.constexpr, BH: tl.constexpr):
    """Offsets (relative to a time row) of a ``(BT, BH, 4)`` tile of ``A`` and a ``(BT, BH, 2)``
    tile of ``b``/``h``, and the block mask ``(1, BH, 1)``."""
    r = tl.arange(0, BT)
    hb = pid_h * BH + tl.arange(0, BH)
    k4 = tl.arange(0, 4)
    k2 = tl.arange(0, 2)
    offs_a = r[:, None, None] * (H * 4) + hb[None, :, None] * 4 + k4[None, None, :]
    offs_s = r[:, None, None] * (H * 2) + hb[None, :, None] * 2 + k2[None, None, :]
    mh = (hb < H)[None, :, None]
    return r, hb, offs_a, offs_s, mh


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd2_fwd_tile(A, Bv, Hout, Init, Final, Pout, CU, T, H, CHUNK, NC,
                  BT: tl.constexpr, BH: tl.constexpr, HAS_INIT: tl.constexpr,
                  STORE_H: tl.constexpr, STORE_FINAL: tl.constexpr, STORE_P: tl.constexpr,
                  VARLEN: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t`` for 2 x 2 blocks over the chunk ``[t0, t1)`` of sequence ``s``;
    state from ``Init[s, c]`` (chunk carry or h0). ``STORE_P``: also the chunk product
    ``A_{t1-1} ... A_{t0}`` into ``Pout[s, c]`` (with a zero start and ``STORE_FINAL`` the chunk
    summary ``[P | E]``)."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    r, hb, offs_a, offs_s, mh = _tile_offsets(pid_h, H, BT, BH)
    mh1 = hb < H
    last = (r == BT - 1)[:, None]
    sc = s.to(tl.int64) * NC + c
    if HAS_INIT:
        x0 = tl.load(Init + sc * H * 2 + hb * 2, mask=mh1, other=0.0).to(tl.float32)
        x1 = tl.load(Init + sc * H * 2 + hb * 2 + 1, mask=mh1, other=0.0).to(tl.float32)
    else:
        x0 = tl.zeros([BH], dtype=tl.float32)
        x1 = tl.zeros([BH], dtype=tl.float32)
    pp = tl.full([BH], 1.0, tl.float32)
    pq = tl.zeros([BH], dtype=tl.float32)
    pr = tl.zeros([BH], dtype=tl.float32)
    ps = tl.full([BH], 1.0, tl.float32)
    ok = ((t0 + r) < t1)[:, None, None] & mh
    a_nxt = tl.load(A + t0 * H * 4 + offs_a, mask=ok, other=0.0)
    b_nxt = tl.load(Bv + t0 * H * 2 + offs_s, mask=ok, other=0.0)
    for ts in range(t0, t1, BT):
        row_ok = ((ts + r) < t1)[:, None]
        m_s = row_ok[:, :, None] & mh
        p, q, rr, ss = _split4(a_nxt.to(tl.float32))
        u, w = tl.split(tl.reshape(b_nxt.to(tl.float32), (BT, BH, 2)))
        ok = ((ts + BT + r) < t1)[:, None, None] & mh
        a_nxt = tl.load(A + (ts + BT) * H * 4 + offs_a, mask=ok, other=0.0)
        b_nxt = tl.load(Bv + (ts + BT) * H * 2 + offs_s, mask=ok, other=0.0)
        # rows past the chunk: identity transition, zero input (the last row then carries on)
        p = tl.where(row_ok, p, 1.0)
        ss = tl.where(row_ok, ss, 1.0)
        cp, cq, cr, cs, cu, cw = tl.associative_scan((p, q, rr, ss, u, w), 0, _mat2_combine)
        h0 = cp * x0[None, :] + cq * x1[None, :] + cu
        h1 = cr * x0[None, :] + cs * x1[None, :] + cw
        if STORE_H:
            tl.store(Hout + ts * H * 2 + offs_s, tl.join(h0, h1).to(Hout.dtype.element_ty), mask=m_s)
        x0 = tl.sum(tl.where(last, h0, 0.0), axis=0)
        x1 = tl.sum(tl.where(last, h1, 0.0), axis=0)
        if STORE_P:  # P <- CA_last P
            lp = tl.sum(tl.where(last, cp, 0.0), axis=0)
            lq = tl.sum(tl.where(last, cq, 0.0), axis=0)
            lr = tl.sum(tl.where(last, cr, 0.0), axis=0)
            ls = tl.sum(tl.where(last, cs, 0.0), axis=0)
            pp, pq, pr, ps = lp * pp + lq * pr, lp * pq + lq * ps, lr * pp + ls * pr, lr * pq + ls * ps
    if STORE_FINAL:
        tl.store(Final + sc * H * 2 + hb * 2, x0, mask=mh1)
        tl.store(Final + sc * H * 2 + hb * 2 + 1, x1, mask=mh1)
    if STORE_P:
        po = Pout + sc * H * 4 + hb * 4
        tl.store(po, pp, mask=mh1)
        tl.store(po + 1, pq, mask=mh1)
        tl.store(po + 2, pr, mask=mh1)
        tl.store(po + 3, ps, mask=mh1)


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd2_bwd_tile(A, Hs, H0, G, DA, DB, MuIn, MuOut, CU, T, H, CHUNK, NC,
                  BT: tl.constexpr, BH: tl.constexpr, HAS_H0: tl.constexpr,
                  HAS_MUIN: tl.constexpr, STORE_GRADS: tl.constexpr, STORE_MUOUT: tl.constexpr,
                  VARLEN: tl.constexpr):
    """Adjoint scan of the chunk ``[t0, t1)`` for 2 x 2 blocks, tiles walked from the chunk's end;
    tile row ``r`` is time ``top - r``. Carry in ``MuIn[s, c]`` (``mu_{t1}``), out ``MuOut[s, c]``."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    r, hb, offs_a, offs_s, mh = _tile_offsets(pid_h, H, BT, BH)
    mh1 = hb < H
    last = (r == BT - 1)[:, None]
    sc = s.to(tl.int64) * NC + c
    if HAS_MUIN:
        l0 = tl.load(MuIn + sc * H * 2 + hb * 2, mask=mh1, other=0.0).to(tl.float32)
        l1 = tl.load(MuIn + sc * H * 2 + hb * 2 + 1, mask=mh1, other=0.0).to(tl.float32)
    else:
        l0 = tl.zeros([BH], dtype=tl.float32)
        l1 = tl.zeros([BH], dtype=tl.float32)
    if HAS_H0:
        i0 = tl.load(H0 + s.to(tl.int64) * H * 2 + hb * 2, mask=mh1, other=0.0).to(tl.float32)
        i1 = tl.load(H0 + s.to(tl.int64) * H * 2 + hb * 2 + 1, mask=mh1, other=0.0).to(tl.float32)
    # row r of a tile is time top - r: offsets of row r relative to time `top` go backwards
    ra = offs_a - 2 * r[:, None, None] * (H * 4)
    rs = offs_s - 2 * r[:, None, None] * (H * 2)
    tt = t1 - 1 - r
    ok = (tt >= t0)[:, None, None] & mh
    c_nxt = tl.load(A + t1 * H * 4 + ra, mask=ok & ((tt + 1) < t1)[:, None, None], other=0.0)
    g_nxt = tl.load(G + (t1 - 1) * H * 2 + rs, mask=ok, other=0.0)
    if STORE_GRADS:
        p_nxt = tl.load(Hs + (t1 - 2) * H * 2 + rs, mask=ok & (tt > bos)[:, None, None], other=0.0)
    for k in range(t0, t1, BT):
        top = t1 - 1 - (k - t0)
        t = top - r
        row_ok = (t >= t0)[:, None]
        m_s = row_ok[:, :, None] & mh
        inner = ((t + 1) < t1)[:, None]
        # coefficient A_{t+1}^T: [[p, r], [q, s]] of A_{t+1} = [[p, q], [r, s]]
        p, q, rr, ss = _split4(c_nxt.to(tl.float32))
        u, w = tl.split(tl.reshape(g_nxt.to(tl.float32), (BT, BH, 2)))
        tn = t - BT
        okn = (tn >= t0)[:, None, None] & mh
        c_nxt = tl.load(A + (top - BT + 1) * H * 4 + ra, mask=okn & ((tn + 1) < t1)[:, None, None],
                        other=0.0)
        g_nxt = tl.load(G + (top - BT) * H * 2 + rs, mask=okn, other=0.0)
        if STORE_GRADS:
            hp = p_nxt.to(tl.float32)
            p_nxt = tl.load(Hs + (top - BT - 1) * H * 2 + rs, mask=okn & (tn > bos)[:, None, None],
                            other=0.0)
        # the chunk's last step (mu_in enters as is) and rows past t0: identity
        ident = inner & row_ok
        p = tl.where(ident, p, 1.0)
        ss = tl.where(ident, ss, 1.0)
        q, rr = tl.where(ident, rr, 0.0), tl.where(ident, q, 0.0)   # transpose
        cp, cq, cr, cs, cu, cw = tl.associative_scan((p, q, rr, ss, u, w), 0, _mat2_combine)
        lam0 = cp * l0[None, :] + cq * l1[None, :] + cu
        lam1 = cr * l0[None, :] + cs * l1[None, :] + cw
        if STORE_GRADS:
            tl.store(DB + top * H * 2 + rs, tl.join(lam0, lam1).to(DB.dtype.element_ty), mask=m_s)
            hp0, hp1 = tl.split(tl.reshape(hp, (BT, BH, 2)))
            if HAS_H0:
                first = (t == bos)[:, None]
                hp0 = tl.where(first, i0[None, :], hp0)
                hp1 = tl.where(first, i1[None, :], hp1)
            da = _join4(lam0 * hp0, lam0 * hp1, lam1 * hp0, lam1 * hp1)
            tl.store(DA + top * H * 4 + ra, da.to(DA.dtype.element_ty), mask=m_s)
        l0 = tl.sum(tl.where(last, lam0, 0.0), axis=0)
        l1 = tl.sum(tl.where(last, lam1, 0.0), axis=0)
    if STORE_MUOUT:  # mu_out = A_{t0}^T lam_{t0} (lam_{t0} = mu_in for an empty chunk: A = I)
        okc = tl.where(t0 < t1, mh1, False)
        ao = A + t0 * H * 4 + hb * 4
        a_p = tl.load(ao, mask=okc, other=1.0).to(tl.float32)
        a_q = tl.load(ao + 1, mask=okc, other=0.0).to(tl.float32)
        a_r = tl.load(ao + 2, mask=okc, other=0.0).to(tl.float32)
        a_s = tl.load(ao + 3, mask=okc, other=1.0).to(tl.float32)
        tl.store(MuOut + sc * H * 2 + hb * 2, a_p * l0 + a_r * l1, mask=mh1)
        tl.store(MuOut + sc * H * 2 + hb * 2 + 1, a_q * l0 + a_s * l1, mask=mh1)
