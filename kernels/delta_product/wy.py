"""Forward WY/UT kernel: per chunk, the chunk-local cumulative log-gate, the fp32 inverse
``A = (I + strictLower(diag(β)(Γ ⊙ K K^T)))^{-1}``, ``W = A diag(βγ) K`` and ``U = A diag(β) V``
(``W``, ``U`` only with ``STORE_WU``; ``TUNE["fuse_wu"]`` forms them in the state kernels instead).

For ``C = 64`` the inverse is blocked: four 16×16 diagonal blocks by forward substitution, then the
off-diagonal blocks ``X_ij = −X_ii Σ_{m=j}^{i−1} L_im X_mj`` (fp32 "ieee" dots). Other chunk sizes
use forward substitution on the whole tile.
"""
import triton
import triton.language as tl


@triton.jit
def _tri_inv16(Lm, r):
    """Inverse of ``I + Lm`` for a strictly lower 16×16 ``Lm`` (forward substitution, fp32)."""
    X = tl.where(r[:, None] == r[None, :], 1., 0.)
    for i in range(1, 16):
        li = tl.sum(tl.where(r[:, None] == i, Lm, 0.), 0)
        X = tl.where(r[:, None] == i, X - tl.sum(li[:, None] * X, 0)[None, :], X)
    return X


@triton.jit
def _load_blk(k, beta, g, s0, n, c0, h, H: tl.constexpr, K: tl.constexpr, NH: tl.constexpr,
              BK: tl.constexpr, USE_G: tl.constexpr):
    r = c0 + tl.arange(0, 16)
    rm = r < n
    s = s0 + r
    ck = tl.arange(0, BK)
    kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32)
    b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
    return kk, b


@triton.jit
def _offdiag(ki, bi, Gi, kj, Gj, DOT: tl.constexpr):
    """``L_ij = diag(β_i) (Γ_ij ⊙ K_i K_j^T)`` for a block below the diagonal (all entries)."""
    return bi[:, None] * tl.exp(Gi[:, None] - Gj[None, :]) * tl.dot(ki, tl.trans(kj), input_precision=DOT)


@triton.jit
def _diag(ki, bi, Gi, r, DOT: tl.constexpr):
    strict = r[:, None] > r[None, :]
    gm = tl.exp(tl.where(strict, Gi[:, None] - Gi[None, :], float("-inf")))
    return tl.where(strict, bi[:, None] * gm * tl.dot(ki, tl.trans(ki), input_precision=DOT), 0.)


@triton.jit
def wy_fwd_kernel(k, v, beta, g, gcum, Ainv, W, U, start_ptr, len_ptr,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                  BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, DOT: tl.constexpr, STORE_WU: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)   # chunk: int64 offsets
    h = tl.program_id(1)
    start = tl.load(start_ptr + c)                     # int64
    n = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < n
    s = start + r                                      # packed sub-step index (int64)
    ck = tl.arange(0, BK)
    cv = tl.arange(0, BV)
    b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
    kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32)
    if USE_G:
        gm = rm & (s % NH == 0)
        gs = tl.load(g + (s // NH) * H + h, mask=gm, other=0.).to(tl.float32)
        G = tl.cumsum(gs, 0)
        tl.store(gcum + s * H + h, G, mask=rm)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
    aptr = Ainv + (c * H + h) * BC * BC
    if BC == 64:
        if USE_G:
            tl.debug_barrier()                         # gcum of this chunk visible to all threads
        r16 = tl.arange(0, 16)
        k0, b0 = _load_blk(k, beta, g, start, n, 0, h, H, K, NH, BK, USE_G)
        k1, b1 = _load_blk(k, beta, g, start, n, 16, h, H, K, NH, BK, USE_G)
        k2, b2 = _load_blk(k, beta, g, start, n, 32, h, H, K, NH, BK, USE_G)
        k3, b3 = _load_blk(k, beta, g, start, n, 48, h, H, K, NH, BK, USE_G)
        if USE_G:
            G0 = tl.load(gcum + (start + r16) * H + h, mask=r16 < n, other=0.)
            G1 = tl.load(gcum + (start + 16 + r16) * H + h, mask=16 + r16 < n, other=0.)
            G2 = tl.load(gcum + (start + 32 + r16) * H + h, mask=32 + r16 < n, other=0.)
            G3 = tl.load(gcum + (start + 48 + r16) * H + h, mask=48 + r16 < n, other=0.)
        else:
            G0 = tl.zeros([16], dtype=tl.float32)
            G1 = G0
            G2 = G0
            G3 = G0
        X00 = _tri_inv16(_diag(k0, b0, G0, r16, DOT), r16)
        X11 = _tri_inv16(_diag(k1, b1, G1, r16, DOT), r16)
        X22 = _tri_inv16(_diag(k2, b2, G2, r16, DOT), r16)
        X33 = _tri_inv16(_diag(k3, b3, G3, r16, DOT), r16)
        L10 = _offdiag(k1, b1, G1, k0, G0, DOT)
        L20 = _offdiag(k2, b2, G2, k0, G0, DOT)
        L21 = _offdiag(k2, b2, G2, k1, G1, DOT)
        L30 = _offdiag(k3, b3, G3, k0, G0, DOT)
        L31 = _offdiag(k3, b3, G3, k1, G1, DOT)
        L32 = _offdiag(k3, b3, G3, k2, G2, DOT)
        X10 = -tl.dot(X11, tl.dot(L10, X00, input_precision="ieee"), input_precision="ieee")
        X21 = -tl.dot(X22, tl.dot(L21, X11, input_precision="ieee"), input_precision="ieee")
        X32 = -tl.dot(X33, tl.dot(L32, X22, input_precision="ieee"), input_precision="ieee")
        X20 = -tl.dot(X22, tl.dot(L20, X00, input_precision="ieee")
                      + tl.dot(L21, X10, input_precision="ieee"), input_precision="ieee")
        X31 = -tl.dot(X33, tl.dot(L31, X11, input_precision="ieee")
                      + tl.dot(L32, X21, input_precision="ieee"), input_precision="ieee")
        X30 = -tl.dot(X33, tl.dot(L30, X00, input_precision="ieee")
                      + tl.dot(L31, X10, input_precision="ieee")
                      + tl.dot(L32, X20, input_precision="ieee"), input_precision="ieee")
        z = tl.zeros([16, 16], dtype=tl.float32)
        o = r16[:, None] * BC + r16[None, :]
        tl.store(aptr + o, X00)
        tl.store(aptr + o + 16, z)
        tl.store(aptr + o + 32, z)
        tl.store(aptr + o + 48, z)
        tl.store(aptr + o + 16 * BC, X10)
        tl.store(aptr + o + 16 * BC + 16, X11)
        tl.store(aptr + o + 16 * BC + 32, z)
        tl.store(aptr + o + 16 * BC + 48, z)
        tl.store(aptr + o + 32 * BC, X20)
        tl.store(aptr + o + 32 * BC + 16, X21)
        tl.store(aptr + o + 32 * BC + 32, X22)
        tl.store(aptr + o + 32 * BC + 48, z)
        tl.store(aptr + o + 48 * BC, X30)
        tl.store(aptr + o + 48 * BC + 16, X31)
        tl.store(aptr + o + 48 * BC + 32, X32)
        tl.store(aptr + o + 48 * BC + 48, X33)
        tl.debug_barrier()
        X = tl.load(aptr + r[:, None] * BC + r[None, :]).to(tl.float32)    # fp16 under a_16bit
    else:
        causal = r[:, None] >= r[None, :]
        strict = r[:, None] > r[None, :]
        gam = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
        kkt = tl.dot(kk, tl.trans(kk), input_precision=DOT)
        Lm = tl.where(strict, b[:, None] * gam * kkt, 0.)
        # forward substitution: row i of X = e_i - sum_{j<i} L[i, j] X[j, :]
        X = tl.where(r[:, None] == r[None, :], 1., 0.)
        for i in range(1, BC):
            li = tl.sum(tl.where(r[:, None] == i, Lm, 0.), 0)          # row i of L, by column
            xi = tl.sum(li[:, None] * X, 0)
            X = tl.where(r[:, None] == i, X - xi[None, :], X)
        tl.store(aptr + r[:, None] * BC + r[None, :], X)
    if STORE_WU:                                       # off under TUNE["fuse_wu"] (state_fused.py)
        w = tl.dot(X, kk * (b * tl.exp(G))[:, None], input_precision=DOT)
        tl.store(W + (s * H + h)[:, None] * K + ck[None, :], w.to(W.dtype.element_ty),
                 mask=rm[:, None] & (ck < K)[None, :])
        for v0 in range(0, V, BV):
            cv = v0 + tl.arange(0, BV)
            mv = rm[:, None] & (cv < V)[None, :]
            vv = tl.load(v + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
            u = tl.dot(X, vv * b[:, None], input_precision=DOT)
            tl.store(U + (s * H + h)[:, None] * V + cv[None, :], u.to(U.dtype.element_ty), mask=mv)
