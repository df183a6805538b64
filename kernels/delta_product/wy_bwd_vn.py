"""Backward, part 2 without ``dA`` (``function.TUNE["wy_bwd_vn"]``, FORM 2 only): the gradients
through ``W``, ``U`` and ``A`` from ``X = A^T dVn`` and the forward's ``Vn``.

With ``M = I + strictLower(diag(β)(Γ ⊙ K K^T))``, ``A = M^{-1}`` and ``Vn = U − W H =
A (diag(β) V − diag(βγ) K H)``, the gradient reaching ``A`` through ``W`` and ``U`` is

    dA = dW (diag(βγ) K)^T + dU (diag(β) V)^T = dVn (diag(β) V − diag(βγ) K H)^T = dVn (M Vn)^T

(``dW = −dVn H^T``, ``dU = dVn``), so the gradient of ``M``'s strict lower part collapses:

    −A^T dA A^T = −A^T dVn Vn^T M^T A^T = −X Vn^T,     E = strictLower(−X Vn^T) ⊙ Γ.

``wy_bwd.py`` forms ``dA`` from ``dW`` (four ``[C, C]`` products with ``C × K`` or ``C × V`` work)
and then ``A^T dA A^T`` (two ``C × C × C`` products) in a serial chain; here one ``X Vn^T`` product
gives ``E``. The state kernel already forms ``X`` (state_fused.py ``STORE_ATDV`` stores it in place
of ``dVn``) and ``dqkwg_bwd`` (``ATDV``) folds the ``A^T dW = −X H^T`` terms into ``dk`` and the
partial ``dβ``, ``dG``, so this kernel neither reads ``A`` nor ``dW``:

    dV = diag(β) X,   dβ = rowsum(V ⊙ X) + rowsum(E ⊙ K K^T) + (γ ⊙ k·(A^T dW), from dqkwg_bwd)
    dS = diag(β) E,   dK = dk_part + (dS + dS^T) K,   dG = dG_p + rowsum(Z) − colsum(Z),  Z = dS ⊙ K K^T

In exact arithmetic this is the same gradient as ``wy_bwd.py``'s; in floating point it is the
gradient of the mathematical ``A = M^{-1}`` rather than of the computed inverse (README.md).
"""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def wy_bwd_vn_kernel(k, v, beta, gcum, vn, xa, dbp, dGp, dk_part, dk, dv, db, dg, start_ptr, len_ptr,
                     PSTRIDE, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                     BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KS: tl.constexpr,
                     NP: tl.constexpr, USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr):
    """Grid ``(chunks, H)``. ``xa``: ``X = A^T dVn`` ``[Ls, H, V]`` fp32; ``vn``: the forward's
    ``Vn``; ``dk_part``: ``dqkwg_bwd``'s ``dk`` (``A^T dW`` term included); ``dbp``, ``dGp``: ``NP``
    partial ``dβ``, ``dG`` row sums (one per ``dqkwg_bwd`` K slice), ``PSTRIDE`` apart. The key side
    runs over ``KS`` slices of ``BK // KS`` columns in one pass (``E`` needs no key)."""
    c = tl.program_id(0).to(tl.int64)   # chunk: int64 offsets
    h = tl.program_id(1)
    start = tl.load(start_ptr + c)
    ln = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < ln
    s = start + r
    b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
    xv = tl.zeros([BC, BC], dtype=tl.float32)                       # X Vn^T
    dbb = tl.zeros([BC], dtype=tl.float32)
    for v0 in range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        mv = rm[:, None] & (cv < V)[None, :]
        x = tl.load(xa + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.)
        vv = tl.load(v + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
        vnew = tl.load(vn + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
        tl.store(dv + (s * H + h)[:, None] * V + cv[None, :], b[:, None] * x, mask=mv)
        dbb += tl.sum(vv * x, 1)
        xv += tl.dot(x, tl.trans(vnew), input_precision=DOT)
    if USE_G:
        G = tl.load(gcum + s * H + h, mask=rm, other=0.)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
    strict = r[:, None] > r[None, :]
    gam = tl.exp(tl.where(strict, G[:, None] - G[None, :], float("-inf")))
    E = tl.where(strict, -xv, 0.) * gam
    dS = E * b[:, None]
    dSS = dS + tl.trans(dS)
    kkt = tl.zeros([BC, BC], dtype=tl.float32)
    BKS: tl.constexpr = BK // KS
    for j in tl.static_range(KS):
        ck = j * BKS + tl.arange(0, BKS)
        mk = rm[:, None] & (ck < K)[None, :]
        kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
        kkt += dot_abt(kr, kr, DOT, RAW)                      # exact for 16-bit keys (fp32 acc)
        dkk = tl.load(dk_part + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
        dkk += tl.dot(dSS, kr.to(tl.float32), input_precision=DOT)
        tl.store(dk + (s * H + h)[:, None] * K + ck[None, :], dkk, mask=mk)
    dbb += tl.sum(E * kkt, 1)
    if USE_G:
        Zl = dS * kkt
        dG = tl.sum(Zl, 1) - tl.sum(Zl, 0)
    else:
        dG = dbb
    _store_db_dg(dbb, dG, dbp, dGp, db, dg, s, rm, h, PSTRIDE, H, NH, NP, USE_G)


@triton.jit
def _store_db_dg(dbb, dG, dbp, dGp, db, dg, s, rm, h, PSTRIDE, H: tl.constexpr, NH: tl.constexpr,
                 NP: tl.constexpr, USE_G: tl.constexpr):
    """Adds the ``NP`` partial ``dβ`` (``dbp``) and ``dG`` (``dGp``) rows, ``PSTRIDE`` apart, to
    ``dbb`` and ``dG`` and stores ``dβ`` and the log-gate gradient: ``dG`` reverse-cumulated inside
    the chunk, read at each token's first sub-step."""
    pb = dbp + s * H + h
    for j in tl.static_range(NP):       # a pointer step a partial: no j · PSTRIDE product in 32 bits
        dbb += tl.load(pb, mask=rm, other=0.)
        pb += PSTRIDE
    tl.store(db + s * H + h, dbb, mask=rm)
    if USE_G:
        pg = dGp + s * H + h
        for j in tl.static_range(NP):
            dG += tl.load(pg, mask=rm, other=0.)
            pg += PSTRIDE
        dgs = tl.sum(dG, 0) - tl.cumsum(dG, 0) + dG                                 # reverse cumsum
        tl.store(dg + (s // NH) * H + h, dgs, mask=rm & (s % NH == 0))


@triton.jit
def wy_partials_kernel(dbp, dGp, db, dg, start_ptr, len_ptr, PSTRIDE, H: tl.constexpr, NH: tl.constexpr,
                       BC: tl.constexpr, NP: tl.constexpr, USE_G: tl.constexpr):
    """Grid ``(chunks, H)``: ``dβ`` and the log-gate gradient from the ``NP`` partial rows alone
    (``TUNE["dqkwg_fuse_wy"]``: ``dqkwg_bwd`` did this kernel's ``wy_bwd_vn_kernel`` work in K
    slices, each leaving its partial sums)."""
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    start = tl.load(start_ptr + c)
    ln = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < ln
    z = tl.zeros([BC], dtype=tl.float32)
    _store_db_dg(z, z, dbp, dGp, db, dg, start + r, rm, h, PSTRIDE, H, NH, NP, USE_G)
