"""Forward WY/UT for ``C = 64`` in two kernels (fla's structure, native here).

Used by ``function.py`` for ``C = 64`` when ``TUNE["wy_split"]`` is set (``wy.py`` otherwise).

* ``tri_inv64_kernel`` (1 warp): chunk-local cumulative log-gate ``G`` and the fp32 inverse
  ``A = (I + strictLower(diag(β)(Γ ⊙ K K^T)))^{-1}`` by blocks: four 16×16 diagonal blocks by forward
  substitution (intra-warp reductions; ``BATCHED``: all four as one [4, 16, 16] tile), then
  ``X_ij = −X_ii Σ_{m=j}^{i−1} L_im X_mj`` (fp32 dots).
* ``wu_fwd_kernel`` (2 warps): ``W = A diag(βγ) K`` and ``U = A diag(β) V`` (not launched under
  ``TUNE["fuse_wu"]``: ``state_fused.py`` forms them in registers).
"""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def _inv16(Lm, r):
    X = tl.where(r[:, None] == r[None, :], 1., 0.)
    for i in range(1, 16):
        li = tl.sum(tl.where(r[:, None] == i, Lm, 0.), 0)
        X = tl.where(r[:, None] == i, X - tl.sum(li[:, None] * X, 0)[None, :], X)
    return X


@triton.jit
def _inv16x4(L0, L1, L2, L3, r):
    """``_inv16`` of four blocks at once as one [4, 16, 16] tile: 15 serial steps instead of 60
    (``TUNE["inv_batched"]``)."""
    bi = tl.arange(0, 4)[:, None, None]
    rr = r[None, :, None]
    Lm = tl.where(bi == 0, L0[None, :, :],
                  tl.where(bi == 1, L1[None, :, :], tl.where(bi == 2, L2[None, :, :], L3[None, :, :])))
    X = tl.where((rr == r[None, None, :]) & (bi >= 0), 1., 0.)
    for i in range(1, 16):
        li = tl.sum(tl.where(rr == i, Lm, 0.), 1)                  # [4, 16]: row i of each L, by column
        X = tl.where(rr == i, X - tl.sum(li[:, :, None] * X, 1)[:, None, :], X)
    return (tl.sum(tl.where(bi == 0, X, 0.), 0), tl.sum(tl.where(bi == 1, X, 0.), 0),
            tl.sum(tl.where(bi == 2, X, 0.), 0), tl.sum(tl.where(bi == 3, X, 0.), 0))


@triton.jit
def _kb(k, start, n, c0, h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    """Keys of the 16 rows from ``c0`` in the inputs' dtype."""
    r = c0 + tl.arange(0, 16)
    ck = tl.arange(0, BK)
    return tl.load(k + ((start + r) * H + h)[:, None] * K + ck[None, :],
                   mask=(r < n)[:, None] & (ck < K)[None, :], other=0.)


@triton.jit
def _blk(k, beta, g, gcum, start, n, c0, h, goff, H: tl.constexpr, K: tl.constexpr, NH: tl.constexpr,
         BK: tl.constexpr, USE_G: tl.constexpr):
    """Keys (all ``BK`` columns), ``β``, chunk-local cumulative log-gate ``G`` of the 16 rows from
    ``c0`` (``G`` stored to ``gcum``), and the gate total carried to the next block."""
    kk = _kb(k, start, n, c0, h, H, K, BK)
    b, G, gnext = _bg(beta, g, gcum, start, n, c0, h, goff, H, NH, USE_G)
    return kk, b, G, gnext


@triton.jit
def _bg(beta, g, gcum, start, n, c0, h, goff, H: tl.constexpr, NH: tl.constexpr, USE_G: tl.constexpr):
    r = c0 + tl.arange(0, 16)
    rm = r < n
    s = start + r
    b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
    if USE_G:
        gs = tl.load(g + (s // NH) * H + h, mask=rm & (s % NH == 0), other=0.).to(tl.float32)
        G = goff + tl.cumsum(gs, 0)
        tl.store(gcum + s * H + h, G, mask=rm)
        gnext = goff + tl.sum(gs, 0)
    else:
        G = tl.zeros([16], dtype=tl.float32)
        gnext = goff
    return b, G, gnext


@triton.jit
def _L(ki, bi, Gi, kj, Gj, DOT: tl.constexpr, RAW: tl.constexpr):
    # keys in their own dtype: a 16-bit K K^T is exact on the tensor cores (fp32 accumulate)
    return bi[:, None] * tl.exp(Gi[:, None] - Gj[None, :]) * dot_abt(ki, kj, DOT, RAW)


@triton.jit
def _Ld(ki, bi, Gi, r, DOT: tl.constexpr, RAW: tl.constexpr):
    strict = r[:, None] > r[None, :]
    gm = tl.exp(tl.where(strict, Gi[:, None] - Gi[None, :], float("-inf")))
    return tl.where(strict, bi[:, None] * gm * dot_abt(ki, ki, DOT, RAW), 0.)


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def tri_inv64_kernel(k, beta, g, gcum, Ainv, start_ptr, len_ptr,
                     H: tl.constexpr, K: tl.constexpr, NH: tl.constexpr, BK: tl.constexpr,
                     USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr, BATCHED: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)   # chunk: int64 offsets
    h = tl.program_id(1)
    start = tl.load(start_ptr + c)
    n = tl.load(len_ptr + c)
    r = tl.arange(0, 16)
    k0, b0, G0, o1 = _blk(k, beta, g, gcum, start, n, 0, h, 0., H, K, NH, BK, USE_G)
    k1, b1, G1, o2 = _blk(k, beta, g, gcum, start, n, 16, h, o1, H, K, NH, BK, USE_G)
    k2, b2, G2, o3 = _blk(k, beta, g, gcum, start, n, 32, h, o2, H, K, NH, BK, USE_G)
    k3, b3, G3, o4 = _blk(k, beta, g, gcum, start, n, 48, h, o3, H, K, NH, BK, USE_G)
    if BATCHED:
        X00, X11, X22, X33 = _inv16x4(_Ld(k0, b0, G0, r, DOT, RAW), _Ld(k1, b1, G1, r, DOT, RAW),
                                      _Ld(k2, b2, G2, r, DOT, RAW), _Ld(k3, b3, G3, r, DOT, RAW), r)
    else:
        X00 = _inv16(_Ld(k0, b0, G0, r, DOT, RAW), r)
        X11 = _inv16(_Ld(k1, b1, G1, r, DOT, RAW), r)
        X22 = _inv16(_Ld(k2, b2, G2, r, DOT, RAW), r)
        X33 = _inv16(_Ld(k3, b3, G3, r, DOT, RAW), r)
    L10 = _L(k1, b1, G1, k0, G0, DOT, RAW)
    L20 = _L(k2, b2, G2, k0, G0, DOT, RAW)
    L21 = _L(k2, b2, G2, k1, G1, DOT, RAW)
    L30 = _L(k3, b3, G3, k0, G0, DOT, RAW)
    L31 = _L(k3, b3, G3, k1, G1, DOT, RAW)
    L32 = _L(k3, b3, G3, k2, G2, DOT, RAW)
    _compose_store(X00, X11, X22, X33, L10, L20, L21, L30, L31, L32, Ainv, c, h, H, r)


@triton.jit
def _compose_store(X00, X11, X22, X33, L10, L20, L21, L30, L31, L32, Ainv, c, h, H: tl.constexpr, r):
    """The off-diagonal blocks ``X_ij = −X_ii Σ_{m=j}^{i−1} L_im X_mj`` and the store of ``A``."""
    X10 = -_mm(X11, _mm(L10, X00))
    X21 = -_mm(X22, _mm(L21, X11))
    X32 = -_mm(X33, _mm(L32, X22))
    X20 = -_mm(X22, _mm(L20, X00) + _mm(L21, X10))
    X31 = -_mm(X33, _mm(L31, X11) + _mm(L32, X21))
    X30 = -_mm(X33, _mm(L30, X00) + _mm(L31, X10) + _mm(L32, X20))
    z = tl.zeros([16, 16], dtype=tl.float32)
    p = Ainv + (c * H + h) * 4096 + r[:, None] * 64 + r[None, :]
    tl.store(p, X00)
    tl.store(p + 16, z)
    tl.store(p + 32, z)
    tl.store(p + 48, z)
    tl.store(p + 1024, X10)
    tl.store(p + 1040, X11)
    tl.store(p + 1056, z)
    tl.store(p + 1072, z)
    tl.store(p + 2048, X20)
    tl.store(p + 2064, X21)
    tl.store(p + 2080, X22)
    tl.store(p + 2096, z)
    tl.store(p + 3072, X30)
    tl.store(p + 3088, X31)
    tl.store(p + 3104, X32)
    tl.store(p + 3120, X33)


@triton.jit
def wu_fwd_kernel(k, v, beta, gcum, Ainv, W, U, start_ptr, len_ptr,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, DOT: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)   # chunk: int64 offsets
    h = tl.program_id(1)
    start = tl.load(start_ptr + c)
    n = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < n
    s = start + r
    ck = tl.arange(0, BK)
    X = tl.load(Ainv + ((c * H + h) * BC + r[:, None]) * BC + r[None, :]).to(tl.float32)  # fp16: a_16bit
    b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
    if USE_G:
        bg = b * tl.exp(tl.load(gcum + s * H + h, mask=rm, other=0.))
    else:
        bg = b
    kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32)
    w = tl.dot(X, kk * bg[:, None], input_precision=DOT)
    tl.store(W + (s * H + h)[:, None] * K + ck[None, :], w.to(W.dtype.element_ty),
             mask=rm[:, None] & (ck < K)[None, :])
    for v0 in range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        mv = rm[:, None] & (cv < V)[None, :]
        vv = tl.load(v + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
        u = tl.dot(X, vv * b[:, None], input_precision=DOT)
        tl.store(U + (s * H + h)[:, None] * V + cv[None, :], u.to(U.dtype.element_ty), mask=mv)
