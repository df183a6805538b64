"""Forward output kernel (parallel over chunks): ``O = scale·[diag(γ) Q H + ((Q K^T) ⊙ Γ ⊙ M) Vn]``,
read only at each token's last sub-step (``q`` and ``o`` are per token, ``[T, H, ·]``)."""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def output_fwd_kernel(q, k, gcum, hs, vn, o, start_ptr, len_ptr, scale,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                      BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr):
    iv = tl.program_id(0)
    c = tl.program_id(1)
    h = tl.program_id(2)
    start = tl.load(start_ptr + c)
    ln = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < ln
    s = start + r
    ck = tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    qm = rm & (s % NH == NH - 1)
    tok = s // NH
    qr = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :],
                 other=0.)
    kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                 other=0.)
    # H and Vn may be stored in 16 bits (function.TUNE); the products accumulate in fp32
    st = tl.load(hs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :],
                 mask=(ck < K)[:, None] & (cv < V)[None, :], other=0.).to(tl.float32)
    vnew = tl.load(vn + (s * H + h)[:, None] * V + cv[None, :], mask=rm[:, None] & (cv < V)[None, :],
                   other=0.).to(tl.float32)
    if USE_G:
        G = tl.load(gcum + s * H + h, mask=rm, other=0.)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
    causal = r[:, None] >= r[None, :]
    gam = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf"))) * scale
    # Q K^T on the inputs' own dtype: exact for 16-bit inputs (fp32 accumulate), scale applied after
    P = dot_abt(qr, kr, DOT, RAW) * gam
    qq = qr.to(tl.float32) * (scale * tl.exp(G))[:, None]
    out = tl.dot(qq, st, input_precision=DOT) + tl.dot(P, vnew, input_precision=DOT)
    tl.store(o + (tok * H + h)[:, None] * V + cv[None, :], out.to(o.dtype.element_ty),
             mask=qm[:, None] & (cv < V)[None, :])
