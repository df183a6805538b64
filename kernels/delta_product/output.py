"""Forward output kernel (parallel over chunks): ``O = scale·[diag(γ) Q H + ((Q K^T) ⊙ Γ ⊙ M) Vn]``,
read only at each token's last sub-step (``q`` and ``o`` are per token, ``[T, H, ·]``)."""
import triton
import triton.language as tl


@triton.jit
def output_fwd_kernel(q, k, gcum, hs, vn, o, start_ptr, len_ptr, scale,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                      BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_G: tl.constexpr, DOT: tl.constexpr):
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
    qq = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32) * scale
    kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32)
    st = tl.load(hs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :],
                 mask=(ck < K)[:, None] & (cv < V)[None, :], other=0.)
    vnew = tl.load(vn + (s * H + h)[:, None] * V + cv[None, :], mask=rm[:, None] & (cv < V)[None, :], other=0.)
    if USE_G:
        G = tl.load(gcum + s * H + h, mask=rm, other=0.)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
    causal = r[:, None] >= r[None, :]
    gam = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
    P = tl.dot(qq, tl.trans(kk), input_precision=DOT) * gam
    out = tl.dot(qq * tl.exp(G)[:, None], st, input_precision=DOT) + tl.dot(P, vnew, input_precision=DOT)
    tl.store(o + (tok * H + h)[:, None] * V + cv[None, :], out.to(o.dtype.element_ty),
             mask=qm[:, None] & (cv < V)[None, :])
