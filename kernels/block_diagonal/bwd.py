"""Backward kernels: the adjoint scan, run backwards in time over a chunk ``[t0, t1)``.

With ``lam_t = dL/dh_t`` (total) and ``mu_t = A_t^T lam_t``:
``lam_t = g_t + mu_{t+1}``, ``db_t = lam_t``, ``dA_t = lam_t h_{t-1}^T``, ``dh0 = mu_{bos}``.
A chunk takes ``mu_in = mu_{t1}`` (the next chunk's ``mu_out``, or ``dh_final`` at the end of a
sequence) and returns ``mu_out = mu_{t0}``.

Kernels: ``_bd_bwd_kernel`` (one step per iteration), ``_bd_bwd_gather`` (the same, ``lam`` by
shuffles; ``scan._bwd_gather``), ``_bd_bwd_kernel_g4`` (4-step groups),
``_bd_bwd_ring`` (a ring of in-flight steps like ``fwd._bd_fwd_ring``; the default for most
``m`` and grid sizes, ``scan._bwd_variant``),
``_diag_bwd_kernel`` (m = 1 tiles).
"""
import triton
import triton.language as tl

from .fwd import _affine_combine, _block_offsets, _block_row_offsets, _padded_rows, _seq_bounds


@triton.jit
def _carry_in(MuIn, H0, s, c, NC, HM, offs_s, mask_s, HAS_MUIN: tl.constexpr, HAS_H0: tl.constexpr):
    """A backward chunk's start, shared by the block kernels: ``sc``, the chunk's offset into
    ``MuIn`` / ``MuOut`` (int64: ``(s NC + c) H m`` can pass 2^31); ``mu = mu_{t1}`` (``MuIn``, or
    zeros at a sequence's end without ``dh_final``); ``h0`` (without ``HAS_H0`` a placeholder the
    kernels do not read), all in ``offs_s``'s layout, fp32."""
    sc = (s.to(tl.int64) * NC + c) * HM
    if HAS_MUIN:
        mu = tl.load(MuIn + sc + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    else:
        mu = tl.zeros(offs_s.shape, dtype=tl.float32)
    if HAS_H0:
        h0 = tl.load(H0 + s.to(tl.int64) * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    else:
        h0 = mu
    return sc, mu, h0


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_bwd_kernel(A, Hs, H0, G, DA, DB, MuIn, MuOut, CU, T, H, CHUNK, NC,
                   M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, NS: tl.constexpr,
                   HAS_H0: tl.constexpr, HAS_MUIN: tl.constexpr, STORE_GRADS: tl.constexpr,
                   STORE_MUOUT: tl.constexpr, VARLEN: tl.constexpr):
    """One step per iteration, ``tl.range(..., num_stages=NS)``; ``_bd_bwd_gather`` is its twin
    for ``M == MP`` without the layout change through shared memory."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    offs_s, mask_s, offs_a, mask_a = _block_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    sc, mu, h0 = _carry_in(MuIn, H0, s, c, NC, HM, offs_s, mask_s, HAS_MUIN, HAS_H0)
    z = 0 * offs_s
    for k in tl.range(t0, t1, num_stages=NS):
        t = t1 - 1 - (k - t0)
        lam = tl.load(G + t * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32) + mu
        a = tl.load(A + t * HMM + offs_a, mask=mask_a, other=0.0).to(tl.float32)
        if STORE_GRADS:
            tl.store(DB + t * HM + offs_s, lam.to(DB.dtype.element_ty), mask=mask_s)
            hp = tl.load(Hs + (t - 1) * HM + offs_s, mask=mask_s & ((t + z) > bos),
                         other=0.0).to(tl.float32)
            if HAS_H0:
                hp = tl.where(t == bos, h0, hp)
            tl.store(DA + t * HMM + offs_a, (lam[:, :, None] * hp[:, None, :]).to(DA.dtype.element_ty),
                     mask=mask_a)
        mu = tl.sum(a * lam[:, :, None], axis=1)
    if STORE_MUOUT:
        tl.store(MuOut + sc + offs_s, mu, mask=mask_s)


@triton.jit
def _gather_offsets(pid_h, H, M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr):
    """Offsets for the backward by shuffles: state element ``r = (block, k)`` a row (``k < MP``;
    rows ``k >= M`` are padding), ``offs_s``/``mask_s`` ``(BH*MP,)``; ``A^T`` offsets/mask
    ``(BH*MP, MP)`` (row ``r`` holds column ``k`` of its block); ``idx[r, i] = MP * block(r) + i``
    for ``tl.gather``."""
    r, j, blk, offs_s, mask_s, idx = _padded_rows(pid_h, H, M, MP, BH)
    offs_a = (blk * (M * M) + r % MP)[:, None] + (j * M)[None, :]
    mask_a = mask_s[:, None] & (j < M)[None, :]
    return offs_s, mask_s, offs_a, mask_a, idx


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_bwd_gather(A, Hs, H0, G, DA, DB, MuIn, MuOut, CU, T, H, CHUNK, NC,
                   M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, NS: tl.constexpr,
                   HAS_H0: tl.constexpr, HAS_MUIN: tl.constexpr, STORE_GRADS: tl.constexpr,
                   STORE_MUOUT: tl.constexpr, VARLEN: tl.constexpr):
    """``_bd_bwd_kernel`` by shuffles, the backward twin of ``fwd._ring_step``'s: row
    ``r = (block, k)`` holds column ``k`` of the block's ``A`` (``aT[r, i] = A[i, k]``, so
    ``mu[r] = sum_i aT[r, i] lam[i]`` stays in the warp) and ``lamx[r, i] = lam[block(r), i]``,
    rebuilt from the row vector ``lam`` by ``tl.gather`` (shuffles where a block's rows share a
    warp) instead of a layout change through shared memory. ``dA^T = lamx * h_{t-1}[r]`` goes
    out at ``A``'s transposed offsets."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    offs_s, mask_s, offs_a, mask_a, idx = _gather_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    sc, mu, h0 = _carry_in(MuIn, H0, s, c, NC, HM, offs_s, mask_s, HAS_MUIN, HAS_H0)
    for k in tl.range(t0, t1, num_stages=NS):
        t = t1 - 1 - (k - t0)
        lam = tl.load(G + t * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32) + mu
        lamx = tl.gather(tl.broadcast_to(lam[:, None], (BH * MP, MP)), idx, 0)
        a = tl.load(A + t * HMM + offs_a, mask=mask_a, other=0.0).to(tl.float32)
        if STORE_GRADS:
            tl.store(DB + t * HM + offs_s, lam.to(DB.dtype.element_ty), mask=mask_s)
            hp = tl.load(Hs + (t - 1) * HM + offs_s, mask=tl.where(t > bos, mask_s, False),
                         other=0.0).to(tl.float32)
            if HAS_H0:
                hp = tl.where(t == bos, h0, hp)
            tl.store(DA + t * HMM + offs_a, (lamx * hp[:, None]).to(DA.dtype.element_ty), mask=mask_a)
        mu = tl.sum(a * lamx, axis=1)
    if STORE_MUOUT:
        tl.store(MuOut + sc + offs_s, mu, mask=mask_s)


@triton.jit
def _bstep(a, g, hp, mu, t, t0, bos, h0, DA, DB, HM, HMM, offs_s, offs_a, mask_s, mask_a,
           HAS_H0: tl.constexpr, STORE_GRADS: tl.constexpr):
    lam = g.to(tl.float32) + mu
    if STORE_GRADS:
        okm = (t + 0 * offs_s) >= t0
        tl.store(DB + t * HM + offs_s, lam.to(DB.dtype.element_ty), mask=mask_s & okm)
        hpf = hp.to(tl.float32)
        if HAS_H0:
            hpf = tl.where(t == bos, h0, hpf)
        tl.store(DA + t * HMM + offs_a, (lam[:, :, None] * hpf[:, None, :]).to(DA.dtype.element_ty),
                 mask=mask_a & okm[:, :, None])
    return tl.where(t >= t0, tl.sum(a.to(tl.float32) * lam[:, :, None], axis=1), mu)


@triton.jit
def _bload(A, G, Hs, t, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS: tl.constexpr):
    ok = (t + 0 * offs_s) >= t0
    a = tl.load(A + t * HMM + offs_a, mask=mask_a & ok[:, :, None], other=0.0)
    g = tl.load(G + t * HM + offs_s, mask=mask_s & ok, other=0.0)
    if STORE_GRADS:
        hp = tl.load(Hs + (t - 1) * HM + offs_s, mask=mask_s & ok & ((t + 0 * offs_s) > bos), other=0.0)
    else:
        hp = g
    return a, g, hp


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_bwd_kernel_g4(A, Hs, H0, G, DA, DB, MuIn, MuOut, CU, T, H, CHUNK, NC,
                      M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr,
                      HAS_H0: tl.constexpr, HAS_MUIN: tl.constexpr, STORE_GRADS: tl.constexpr,
                      STORE_MUOUT: tl.constexpr, VARLEN: tl.constexpr):
    """``_bd_bwd_kernel`` hand-pipelined like ``_bd_fwd_kernel_g4``: groups of 4 steps, newest
    first, the next (older) group's ``A``, ``g``, ``h_{t-1}`` loaded before the current one is used."""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    offs_s, mask_s, offs_a, mask_a = _block_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    sc, mu, h0 = _carry_in(MuIn, H0, s, c, NC, HM, offs_s, mask_s, HAS_MUIN, HAS_H0)
    top = t1 - 1
    a0, g0, p0 = _bload(A, G, Hs, top, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
    a1, g1, p1 = _bload(A, G, Hs, top - 1, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
    a2, g2, p2 = _bload(A, G, Hs, top - 2, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
    a3, g3, p3 = _bload(A, G, Hs, top - 3, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
    for k in range(t0, t1, 4):
        top = t1 - 1 - (k - t0)
        tn = top - 4
        n0, e0, q0 = _bload(A, G, Hs, tn, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
        n1, e1, q1 = _bload(A, G, Hs, tn - 1, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
        n2, e2, q2 = _bload(A, G, Hs, tn - 2, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
        n3, e3, q3 = _bload(A, G, Hs, tn - 3, t0, bos, HM, HMM, offs_s, offs_a, mask_s, mask_a, STORE_GRADS)
        mu = _bstep(a0, g0, p0, mu, top, t0, bos, h0, DA, DB, HM, HMM, offs_s, offs_a, mask_s, mask_a,
                    HAS_H0, STORE_GRADS)
        mu = _bstep(a1, g1, p1, mu, top - 1, t0, bos, h0, DA, DB, HM, HMM, offs_s, offs_a, mask_s, mask_a,
                    HAS_H0, STORE_GRADS)
        mu = _bstep(a2, g2, p2, mu, top - 2, t0, bos, h0, DA, DB, HM, HMM, offs_s, offs_a, mask_s, mask_a,
                    HAS_H0, STORE_GRADS)
        mu = _bstep(a3, g3, p3, mu, top - 3, t0, bos, h0, DA, DB, HM, HMM, offs_s, offs_a, mask_s, mask_a,
                    HAS_H0, STORE_GRADS)
        a0, a1, a2, a3 = n0, n1, n2, n3
        g0, g1, g2, g3 = e0, e1, e2, e3
        p0, p1, p2, p3 = q0, q1, q2, q3
    if STORE_MUOUT:
        tl.store(MuOut + sc + offs_s, mu, mask=mask_s)


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _diag_bwd_kernel(Aa, Hs, H0, G, DA, DB, MuIn, MuOut, CU, T, N, CHUNK, NC,
                     BT: tl.constexpr, BN: tl.constexpr, HAS_H0: tl.constexpr,
                     HAS_MUIN: tl.constexpr, STORE_GRADS: tl.constexpr, STORE_MUOUT: tl.constexpr,
                     VARLEN: tl.constexpr, NV: tl.constexpr = 1, VEC: tl.constexpr = 0):
    """m = 1: tile row ``r`` is time ``top - 1 - r`` (reversal by indexing, not ``reverse=True``);
    ``lam_t = g_t + coef_t * lam_{t+1}`` with ``coef_t = a_{t+1}`` inside the chunk and ``1`` at its
    last step, where the carry is ``mu_in`` itself. ``NV``, ``VEC`` as in ``fwd._diag_fwd_kernel``."""
    N = (N // NV) * NV  # see fwd._diag_fwd_kernel
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    n = pid_n * BN + tl.arange(0, BN)
    if VEC > 0:
        n = tl.max_contiguous(n, VEC)  # see fwd._diag_fwd_kernel
    mn = n < N
    r = tl.arange(0, BT)
    last = (r == BT - 1)[:, None]
    sc = (s.to(tl.int64) * NC + c) * N
    if HAS_MUIN:
        lam_c = tl.load(MuIn + sc + n, mask=mn, other=0.0).to(tl.float32)
    else:
        lam_c = tl.zeros([BN], dtype=tl.float32)
    if HAS_H0:
        h0 = tl.load(H0 + s.to(tl.int64) * N + n, mask=mn, other=0.0).to(tl.float32)
    # tile rows r = 0..BT-1 are times top - 1 - r; prefetch the next (older) tile
    offs0 = -r[:, None] * N + n[None, :]
    tt = t1 - 1 - r
    valid = (tt >= t0)[:, None] & mn[None, :]
    c_nxt = tl.load(Aa + (t1 - 1) * N + offs0 + N, mask=valid & (tt + 1 < t1)[:, None], other=1.0)
    g_nxt = tl.load(G + (t1 - 1) * N + offs0, mask=valid, other=0.0)
    if STORE_GRADS:
        p_nxt = tl.load(Hs + (t1 - 1) * N + offs0 - N, mask=valid & (tt > bos)[:, None], other=0.0)
    for k in range(t0, t1, BT):
        top = t1 - 1 - (k - t0)
        t = top - r
        valid = (t >= t0)[:, None] & mn[None, :]
        offs = top * N + offs0
        coef = c_nxt.to(tl.float32)
        gv = g_nxt.to(tl.float32)
        tn = t - BT
        vn = (tn >= t0)[:, None] & mn[None, :]
        c_nxt = tl.load(Aa + offs - BT * N + N, mask=vn & (tn + 1 < t1)[:, None], other=1.0)
        g_nxt = tl.load(G + offs - BT * N, mask=vn, other=0.0)
        if STORE_GRADS:
            hp = p_nxt.to(tl.float32)
            p_nxt = tl.load(Hs + offs - BT * N - N, mask=vn & (tn > bos)[:, None], other=0.0)
        cc, cv = tl.associative_scan((coef, gv), 0, _affine_combine)
        lam = cc * lam_c[None, :] + cv
        if STORE_GRADS:
            tl.store(DB + offs, lam.to(DB.dtype.element_ty), mask=valid)
            if HAS_H0:
                hp = tl.where((t == bos)[:, None], h0[None, :], hp)
            tl.store(DA + offs, (lam * hp).to(DA.dtype.element_ty), mask=valid)
        lam_c = tl.sum(tl.where(last, lam, 0.0), axis=0)
    if STORE_MUOUT:
        a0 = tl.load(Aa + t0 * N + n, mask=mn & ((t0 + 0 * n) < t1), other=1.0).to(tl.float32)
        tl.store(MuOut + sc + n, a0 * lam_c, mask=mn)


# ----------------------------------------------------------------------------- ring kernel
@triton.jit
def _bring_ld(A, G, Hs, t, t0, bos, offs_a, offs_s, mask_a, mask_s, HM, HMM,
              STORE_GRADS: tl.constexpr):
    """Loads ``A_t``, ``g_t`` and ``h_{t-1}`` (zero before ``t0`` / at ``bos``); scalar time
    masks through ``tl.where`` keep the block loads vectorised (see ``fwd._ring_ld``)."""
    ok = t >= t0
    a = tl.load(A + t * HMM + offs_a, mask=tl.where(ok, mask_a, False), other=0.0)
    g = tl.load(G + t * HM + offs_s, mask=tl.where(ok, mask_s, False), other=0.0)
    if STORE_GRADS:
        hp = tl.load(Hs + (t - 1) * HM + offs_s, mask=tl.where(ok & (t > bos), mask_s, False),
                     other=0.0)
    else:
        hp = g
    return a, g, hp


@triton.jit
def _bring_step(A, G, Hs, DA, DB, a, g, hp, mu, h0, t, t0, bos, tn, offs_a, offs_s, mask_a, mask_s,
                HM, HMM, MP: tl.constexpr, BH: tl.constexpr, HAS_H0: tl.constexpr,
                STORE_GRADS: tl.constexpr):
    """Step ``t`` (newest first) with the slot ``(a, g, hp)``, then refill it with step ``tn``."""
    lam = g.to(tl.float32) + mu
    if STORE_GRADS:
        tl.store(DB + t * HM + offs_s, lam.to(DB.dtype.element_ty), mask=tl.where(t >= t0, mask_s, False))
        hpf = hp.to(tl.float32)
        if HAS_H0:
            hpf = tl.where(t == bos, h0, hpf)
        da = tl.reshape(lam[:, :, None] * hpf[:, None, :], (BH, MP * MP))
        tl.store(DA + t * HMM + offs_a, da.to(DA.dtype.element_ty), mask=tl.where(t >= t0, mask_a, False))
    a3 = tl.reshape(a.to(tl.float32), (BH, MP, MP))
    mu = tl.where(t >= t0, tl.sum(a3 * lam[:, :, None], axis=1), mu)
    a, g, hp = _bring_ld(A, G, Hs, tn, t0, bos, offs_a, offs_s, mask_a, mask_s, HM, HMM, STORE_GRADS)
    return mu, a, g, hp


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_bwd_ring(A, Hs, H0, G, DA, DB, MuIn, MuOut, CU, T, H, CHUNK, NC,
                 M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, R: tl.constexpr,
                 HAS_H0: tl.constexpr, HAS_MUIN: tl.constexpr, STORE_GRADS: tl.constexpr,
                 STORE_MUOUT: tl.constexpr, VARLEN: tl.constexpr):
    """``_bd_bwd_kernel`` as a ring of ``4R`` slots like ``fwd._bd_fwd_ring``: scalar time masks,
    ``A``/``dA`` as ``(BH, MP*MP)`` rows (16-byte accesses), newest step first. (``lam`` by
    shuffles as in ``_bd_bwd_gather`` was slower here: README.md "Backward by shuffles".)"""
    pid_h = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    offs_s, mask_s, offs_a, mask_a = _block_row_offsets(pid_h, H, M, MP, BH)
    HM = H * M
    HMM = HM * M
    sc, mu, h0 = _carry_in(MuIn, H0, s, c, NC, HM, offs_s, mask_s, HAS_MUIN, HAS_H0)
    D = 4 * R
    top = t1 - 1
    a0, g0, p0 = _bring_ld(A, G, Hs, top - 0, t0, bos, offs_a, offs_s, mask_a, mask_s,
                             HM, HMM, STORE_GRADS)
    a1, g1, p1 = _bring_ld(A, G, Hs, top - 1, t0, bos, offs_a, offs_s, mask_a, mask_s,
                             HM, HMM, STORE_GRADS)
    a2, g2, p2 = _bring_ld(A, G, Hs, top - 2, t0, bos, offs_a, offs_s, mask_a, mask_s,
                             HM, HMM, STORE_GRADS)
    a3, g3, p3 = _bring_ld(A, G, Hs, top - 3, t0, bos, offs_a, offs_s, mask_a, mask_s,
                             HM, HMM, STORE_GRADS)
    if R >= 2:
        a4, g4, p4 = _bring_ld(A, G, Hs, top - 4, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a5, g5, p5 = _bring_ld(A, G, Hs, top - 5, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a6, g6, p6 = _bring_ld(A, G, Hs, top - 6, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a7, g7, p7 = _bring_ld(A, G, Hs, top - 7, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
    if R >= 4:
        a8, g8, p8 = _bring_ld(A, G, Hs, top - 8, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a9, g9, p9 = _bring_ld(A, G, Hs, top - 9, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a10, g10, p10 = _bring_ld(A, G, Hs, top - 10, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a11, g11, p11 = _bring_ld(A, G, Hs, top - 11, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a12, g12, p12 = _bring_ld(A, G, Hs, top - 12, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a13, g13, p13 = _bring_ld(A, G, Hs, top - 13, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a14, g14, p14 = _bring_ld(A, G, Hs, top - 14, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
        a15, g15, p15 = _bring_ld(A, G, Hs, top - 15, t0, bos, offs_a, offs_s, mask_a, mask_s,
                                 HM, HMM, STORE_GRADS)
    for kk in range(t0, t1, D):
        top = t1 - 1 - (kk - t0)
        mu, a0, g0, p0 = _bring_step(
            A, G, Hs, DA, DB, a0, g0, p0, mu, h0, top - 0, t0, bos, top - D - 0, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
        mu, a1, g1, p1 = _bring_step(
            A, G, Hs, DA, DB, a1, g1, p1, mu, h0, top - 1, t0, bos, top - D - 1, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
        mu, a2, g2, p2 = _bring_step(
            A, G, Hs, DA, DB, a2, g2, p2, mu, h0, top - 2, t0, bos, top - D - 2, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
        mu, a3, g3, p3 = _bring_step(
            A, G, Hs, DA, DB, a3, g3, p3, mu, h0, top - 3, t0, bos, top - D - 3, offs_a,
            offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
        if R >= 2:
            mu, a4, g4, p4 = _bring_step(
                A, G, Hs, DA, DB, a4, g4, p4, mu, h0, top - 4, t0, bos, top - D - 4, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a5, g5, p5 = _bring_step(
                A, G, Hs, DA, DB, a5, g5, p5, mu, h0, top - 5, t0, bos, top - D - 5, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a6, g6, p6 = _bring_step(
                A, G, Hs, DA, DB, a6, g6, p6, mu, h0, top - 6, t0, bos, top - D - 6, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a7, g7, p7 = _bring_step(
                A, G, Hs, DA, DB, a7, g7, p7, mu, h0, top - 7, t0, bos, top - D - 7, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
        if R >= 4:
            mu, a8, g8, p8 = _bring_step(
                A, G, Hs, DA, DB, a8, g8, p8, mu, h0, top - 8, t0, bos, top - D - 8, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a9, g9, p9 = _bring_step(
                A, G, Hs, DA, DB, a9, g9, p9, mu, h0, top - 9, t0, bos, top - D - 9, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a10, g10, p10 = _bring_step(
                A, G, Hs, DA, DB, a10, g10, p10, mu, h0, top - 10, t0, bos, top - D - 10, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a11, g11, p11 = _bring_step(
                A, G, Hs, DA, DB, a11, g11, p11, mu, h0, top - 11, t0, bos, top - D - 11, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a12, g12, p12 = _bring_step(
                A, G, Hs, DA, DB, a12, g12, p12, mu, h0, top - 12, t0, bos, top - D - 12, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a13, g13, p13 = _bring_step(
                A, G, Hs, DA, DB, a13, g13, p13, mu, h0, top - 13, t0, bos, top - D - 13, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a14, g14, p14 = _bring_step(
                A, G, Hs, DA, DB, a14, g14, p14, mu, h0, top - 14, t0, bos, top - D - 14, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
            mu, a15, g15, p15 = _bring_step(
                A, G, Hs, DA, DB, a15, g15, p15, mu, h0, top - 15, t0, bos, top - D - 15, offs_a,
                offs_s, mask_a, mask_s, HM, HMM, MP, BH, HAS_H0, STORE_GRADS)
    if STORE_MUOUT:
        tl.store(MuOut + sc + offs_s, mu, mask=mask_s)
