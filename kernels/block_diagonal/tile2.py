"""``m = 2`` forward on ``(BT, BH)`` tiles: a parallel scan over time inside the tile.

The sequential kernels (``fwd.py``) walk time one step at a time, so a program's run time is
``T`` times the latency of one step. Where the grid has few programs (B8 T2048 N768: 96 one-warp
programs at ``m = 2``) that bound shows: on an H100 and an H200 the ring8 pass took the same
0.108 / 0.099 ms although the H200 copies 40 % faster. This kernel treats a 2 x 2 block like the
``m = 1`` tiles (``fwd._diag_fwd_kernel``): it loads ``BT`` steps of ``BH`` blocks at once (the
next tile is prefetched while the current one is scanned), splits each block into its six
scalars, and composes them with ``tl.associative_scan`` over the time axis, the combine being
the affine map ``(P, e) then (Q, f) = (Q P, Q e + f)``. From the cumulative ``(CA_t, cb_t)`` and
the state ``x`` entering the tile, ``h_t = CA_t x + cb_t``; the tile's last row is the next ``x``.
Steps past the end of a sequence are the identity map, so the last row is always the last state.

Same arguments as the sequential kernels (``Init`` per (sequence, chunk), ``CHUNK``/``NC`` for the
chunked passes, ``cu_seqlens`` offsets), so ``scan._fwd_launch`` can use it for any pass.
"""
import triton
import triton.language as tl

from .fwd import _seq_bounds


@triton.jit
def _affine2_combine(p11, p12, p21, p22, e1, e2, q11, q12, q21, q22, f1, f2):
    """(P, e) (earlier) then (Q, f) (later): (Q P, Q e + f)."""
    return (q11 * p11 + q12 * p21, q11 * p12 + q12 * p22,
            q21 * p11 + q22 * p21, q21 * p12 + q22 * p22,
            q11 * e1 + q12 * e2 + f1, q21 * e1 + q22 * e2 + f2)


@triton.jit
def _load_tile(A, Bv, ts, t1, offs_a, offs_s, mh, r, HM, HMM):
    ok = (ts + r) < t1
    a = tl.load(A + ts * HMM + offs_a, mask=ok[:, None, None] & mh[None, :, None], other=0.0)
    b = tl.load(Bv + ts * HM + offs_s, mask=ok[:, None, None] & mh[None, :, None], other=0.0)
    return a, b


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd2_fwd_tile(A, Bv, Hout, Init, Final, CU, T, H, CHUNK, NC,
                  BT: tl.constexpr, BH: tl.constexpr, HAS_INIT: tl.constexpr,
                  STORE_H: tl.constexpr, STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t`` for ``m = 2``: ``A (rows, H, 2, 2)``, ``b``/``h (rows, H, 2)``,
    program = (block group of ``BH``, sequence, chunk)."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    hb = pid_h * BH + tl.arange(0, BH)
    mh = hb < H
    r = tl.arange(0, BT)
    k4 = tl.arange(0, 4)
    k2 = tl.arange(0, 2)
    HM = H * 2
    HMM = H * 4
    offs_a = r[:, None, None] * HMM + hb[None, :, None] * 4 + k4[None, None, :]
    offs_s = r[:, None, None] * HM + hb[None, :, None] * 2 + k2[None, None, :]
    offs_x = hb[:, None] * 2 + k2[None, :]
    sc = (s.to(tl.int64) * NC + c) * HM
    if HAS_INIT:
        x1, x2 = tl.split(tl.load(Init + sc + offs_x, mask=mh[:, None], other=0.0).to(tl.float32))
    else:
        x1 = tl.zeros([BH], dtype=tl.float32)
        x2 = tl.zeros([BH], dtype=tl.float32)
    last = (r == BT - 1)[:, None]
    a_nxt, b_nxt = _load_tile(A, Bv, t0, t1, offs_a, offs_s, mh, r, HM, HMM)
    for ts in range(t0, t1, BT):
        a = a_nxt.to(tl.float32)
        b = b_nxt.to(tl.float32)
        a_nxt, b_nxt = _load_tile(A, Bv, ts + BT, t1, offs_a, offs_s, mh, r, HM, HMM)
        # (BT, BH, 4) -> column j of each block: (a_0j, a_1j), then the scalars
        col0, col1 = tl.split(tl.reshape(a, (BT, BH, 2, 2)))
        a11, a21 = tl.split(col0)
        a12, a22 = tl.split(col1)
        b1, b2 = tl.split(b)
        ok = ((ts + r) < t1)[:, None]
        a11 = tl.where(ok, a11, 1.0)  # past the end: the identity, so the last row is the state
        a22 = tl.where(ok, a22, 1.0)
        p11, p12, p21, p22, e1, e2 = tl.associative_scan((a11, a12, a21, a22, b1, b2), 0,
                                                         _affine2_combine)
        h1 = p11 * x1[None, :] + p12 * x2[None, :] + e1
        h2 = p21 * x1[None, :] + p22 * x2[None, :] + e2
        if STORE_H:
            tl.store(Hout + ts * HM + offs_s, tl.join(h1, h2).to(Hout.dtype.element_ty),
                     mask=ok[:, :, None] & mh[None, :, None])
        x1 = tl.sum(tl.where(last, h1, 0.0), axis=0)
        x2 = tl.sum(tl.where(last, h2, 0.0), axis=0)
    if STORE_FINAL:
        tl.store(Final + sc + offs_x, tl.join(x1, x2), mask=mh[:, None])
