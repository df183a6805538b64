"""Backward, part 2 (parallel over chunks): gradients through ``W = A diag(βγ) K``,
``U = A diag(β) V`` and ``A = (I + strictLower(diag(β)(Γ ⊙ K K^T)))^{-1}`` given ``dW`` and
``dU = dVn``; finishes ``dk``, gives ``dv``, ``dβ`` and the log-gate gradient (reverse cumulative
sum of ``dG`` inside the chunk, read at each token's first sub-step). README.md has the derivation.
"""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def wy_bwd_kernel(k, v, beta, gcum, Ainv, dW, dvn, dGp, dk_part, dk, dv, db, dg, start_ptr, len_ptr,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                  BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr, KS: tl.constexpr = 1,
                  EARLY: tl.constexpr = False):
    """``KS > 1`` (``function.TUNE["wy_bwd_ksplit"]``): the key-side work in ``KS`` slices of
    ``BK // KS`` columns, in two passes (``_wy_bwd_k_sliced``) instead of ``[C, BK]`` fp32 tiles of
    ``K``, ``dW``, ``A^T dW`` and ``dK`` live at once. ``EARLY`` (``KS > 1``,
    ``function.TUNE["wy_bwd_early_db"]``): dβ and dg stored before the second pass."""
    c = tl.program_id(0).to(tl.int64)   # chunk: int64 offsets
    h = tl.program_id(1)
    start = tl.load(start_ptr + c)
    ln = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < ln
    s = start + r
    ck = tl.arange(0, BK)
    mk = rm[:, None] & (ck < K)[None, :]
    b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
    A = tl.load(Ainv + ((c * H + h) * BC + r[:, None]) * BC + r[None, :]).to(tl.float32)  # fp16: a_16bit
    if USE_G:
        G = tl.load(gcum + s * H + h, mask=rm, other=0.)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
    eg = tl.exp(G)
    dA = tl.zeros([BC, BC], dtype=tl.float32)
    dbb = tl.zeros([BC], dtype=tl.float32)
    for v0 in range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        mv = rm[:, None] & (cv < V)[None, :]
        dvnew = tl.load(dvn + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.)
        vv = tl.load(v + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
        AtdU = tl.dot(tl.trans(A), dvnew, input_precision=DOT)
        tl.store(dv + (s * H + h)[:, None] * V + cv[None, :], b[:, None] * AtdU, mask=mv)
        dbb += tl.sum(vv * AtdU, 1)
        dA += tl.dot(dvnew, tl.trans(vv * b[:, None]), input_precision=DOT)
    if KS > 1:
        _wy_bwd_k_sliced(k, dW, dGp, dk_part, dk, db, dg, A, dA, dbb, b, eg, G, s, rm, r, h, H, K, NH,
                         BK // KS, KS, USE_G, DOT, RAW, EARLY)
        return
    kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
    kk = kr.to(tl.float32)
    dw = tl.load(dW + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
    dkk = tl.load(dk_part + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
    AtdW = tl.dot(tl.trans(A), dw, input_precision=DOT)
    kdw = tl.sum(kk * AtdW, 1)
    dkk += (b * eg)[:, None] * AtdW
    dbb += eg * kdw
    dA += tl.dot(dw, tl.trans(kk * (b * eg)[:, None]), input_precision=DOT)
    # A = (I + L)^{-1}: dL = -A^T dA A^T (strict lower part), L = diag(β)(Γ ⊙ K K^T)
    dL = -tl.dot(tl.dot(tl.trans(A), dA, input_precision=DOT), tl.trans(A), input_precision=DOT)
    strict = r[:, None] > r[None, :]
    gam = tl.exp(tl.where(strict, G[:, None] - G[None, :], float("-inf")))
    kkt = dot_abt(kr, kr, DOT, RAW)                            # exact for 16-bit keys (fp32 acc)
    E = tl.where(strict, dL, 0.) * gam
    dbb += tl.sum(E * kkt, 1)
    dS = E * b[:, None]
    dkk += tl.dot(dS + tl.trans(dS), kk, input_precision=DOT)
    tl.store(dk + (s * H + h)[:, None] * K + ck[None, :], dkk, mask=mk)
    _wy_bwd_store_db_dg(db, dg, dGp, dbb, dS, kkt, b * eg, kdw, s, rm, h, H, NH, USE_G)


@triton.jit
def _wy_bwd_store_db_dg(db, dg, dGp, dbb, dS, kkt, beg, kdw, s, rm, h, H: tl.constexpr, NH: tl.constexpr,
                        USE_G: tl.constexpr):
    """Stores ``dβ`` and the log-gate gradient: ``dG = dG_p + βγ k·(A^T dW) + rowsum(Z) − colsum(Z)``
    with ``Z = dS ⊙ K K^T``, reverse-cumulated inside the chunk and read at each token's first
    sub-step."""
    tl.store(db + s * H + h, dbb, mask=rm)
    if USE_G:
        Zl = dS * kkt
        dG = tl.load(dGp + s * H + h, mask=rm, other=0.) + beg * kdw + tl.sum(Zl, 1) - tl.sum(Zl, 0)
        dgs = tl.sum(dG, 0) - tl.cumsum(dG, 0) + dG                                 # reverse cumsum
        tl.store(dg + (s // NH) * H + h, dgs, mask=rm & (s % NH == 0))


@triton.jit
def _wy_bwd_k_sliced(k, dW, dGp, dk_part, dk, db, dg, A, dA, dbb, b, eg, G, s, rm, r, h,
                     H: tl.constexpr, K: tl.constexpr, NH: tl.constexpr, BKS: tl.constexpr,
                     KS: tl.constexpr, USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr,
                     EARLY: tl.constexpr):
    """The key-side part of ``wy_bwd_kernel`` over ``KS`` column slices. Pass 1 sums what needs all
    of ``K``: ``k·(A^T dW)`` per row, ``dA``, ``K K^T``. Pass 2 forms ``dK`` slice by slice from
    ``dK_part + diag(βγ) A^T dW + (dS + dS^T) K``, recomputing the ``A^T dW`` slice (one more
    ``[C, C] x [C, BKS]`` dot per slice) instead of keeping it. Both passes unrolled: as ``range``
    loops (sm_90a: no spills) they were 1.008-1.012x the fwd+bwd time on an H200, and at 2 stages
    their dβ came out wrong (TUNING_LOG.md, 2026-12-03)."""
    kdw = tl.zeros([r.shape[0]], dtype=tl.float32)
    kkt = tl.zeros([r.shape[0], r.shape[0]], dtype=tl.float32)
    beg = b * eg
    for j in tl.static_range(KS):
        ck = j * BKS + tl.arange(0, BKS)
        mk = rm[:, None] & (ck < K)[None, :]
        kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
        kk = kr.to(tl.float32)
        dw = tl.load(dW + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
        kdw += tl.sum(kk * tl.dot(tl.trans(A), dw, input_precision=DOT), 1)
        dA += tl.dot(dw, tl.trans(kk * beg[:, None]), input_precision=DOT)
        kkt += dot_abt(kr, kr, DOT, RAW)                      # exact for 16-bit keys (fp32 acc)
    dbb += eg * kdw
    dL = -tl.dot(tl.dot(tl.trans(A), dA, input_precision=DOT), tl.trans(A), input_precision=DOT)
    strict = r[:, None] > r[None, :]
    gam = tl.exp(tl.where(strict, G[:, None] - G[None, :], float("-inf")))
    E = tl.where(strict, dL, 0.) * gam
    dbb += tl.sum(E * kkt, 1)
    dS = E * b[:, None]
    if EARLY:
        # dβ and dg need nothing from pass 2: stored before it, so K K^T, k·(A^T dW) and G are not
        # live through it (sm_90a, Triton 3.6 ptxas, K=V=128, bf16 launches: spills 44 -> 0 B a
        # thread ungated, 72 -> 24 gated)
        _wy_bwd_store_db_dg(db, dg, dGp, dbb, dS, kkt, beg, kdw, s, rm, h, H, NH, USE_G)
    dSS = dS + tl.trans(dS)
    for j in tl.static_range(KS):
        ck = j * BKS + tl.arange(0, BKS)
        mk = rm[:, None] & (ck < K)[None, :]
        kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.).to(tl.float32)
        dw = tl.load(dW + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
        dkk = tl.load(dk_part + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
        dkk += beg[:, None] * tl.dot(tl.trans(A), dw, input_precision=DOT)
        dkk += tl.dot(dSS, kk, input_precision=DOT)
        tl.store(dk + (s * H + h)[:, None] * K + ck[None, :], dkk, mask=mk)
    if not EARLY:
        _wy_bwd_store_db_dg(db, dg, dGp, dbb, dS, kkt, beg, kdw, s, rm, h, H, NH, USE_G)
