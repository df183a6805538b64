"""Forward output kernel (parallel over chunks): ``O = scale·[diag(γ) Q H + ((Q K^T) ⊙ Γ ⊙ M) Vn]``,
read only at each token's last sub-step (``q`` and ``o`` are per token, ``[T, H, ·]``)."""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def output_fwd_kernel(q, k, gcum, hs, vn, o, start_ptr, len_ptr, scale,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                      BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr,
                      RAW_H: tl.constexpr = False):
    """``RAW_H`` (``function.TUNE["output_raw_h"]``; 16-bit ``q`` and ``H`` of one dtype): ``Q H`` on
    the stored 16-bit tiles as they are (exact products, fp32 accumulate, twice the tf32 MMA rate,
    no fp32 copies), its rows scaled by ``scale·γ`` after the dot instead of ``Q``'s before."""
    iv = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)   # chunk: offsets (c·H + h)·K·V pass 2^31
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
                 mask=(ck < K)[:, None] & (cv < V)[None, :], other=0.)
    if not RAW_H:
        st = st.to(tl.float32)
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
    if RAW_H:
        out = tl.dot(qr, st, input_precision=DOT) * (scale * tl.exp(G))[:, None] + \
            tl.dot(P, vnew, input_precision=DOT)
    else:
        qq = qr.to(tl.float32) * (scale * tl.exp(G))[:, None]
        out = tl.dot(qq, st, input_precision=DOT) + tl.dot(P, vnew, input_precision=DOT)
    tl.store(o + (tok * H + h)[:, None] * V + cv[None, :], out.to(o.dtype.element_ty),
             mask=qm[:, None] & (cv < V)[None, :])


@triton.jit
def output_tok_fwd_kernel(q, k, gcum, hs, vn, o, first_ptr, count_ptr, start_ptr, len_ptr, scale,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                          BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr,
                          RAW_H: tl.constexpr = False, HS_CHUNK: tl.constexpr = False):
    """The output over a token chunk (``BC`` tokens = ``NH`` chunks of ``BC`` sub-steps) from the
    one state ``H`` at its start (``TUNE["token_chunk_output"]``):
    ``O = scale·[diag(γ) Q H + Σ_i ((Q K_i^T) ⊙ Γ_i ⊙ M_i) Vn_i]`` over its chunks ``i``, with
    ``γ``, ``Γ`` taken from the token chunk's start (``gcum`` restarts at every chunk: the chunks'
    gate totals are added back). Same sums as ``output_fwd_kernel`` run on every chunk, since each
    chunk's ``Vn`` is taken against the state at that chunk's start. ``RAW_H``: as in
    ``output_fwd_kernel``. ``HS_CHUNK`` (a forward with gradients,
    ``TUNE["token_chunk_output_grad"]``): ``hs`` holds one state per chunk, as the backward needs,
    and the token chunk's is that of its first chunk; otherwise one per token chunk."""
    iv = tl.program_id(0)
    tc = tl.program_id(1).to(tl.int64)  # token chunk: int64 offsets, as c
    h = tl.program_id(2)
    cf = tl.load(first_ptr + tc)
    nsub = tl.load(count_ptr + tc)
    s0 = tl.load(start_ptr + cf)
    s_end = tl.load(start_ptr + cf + nsub - 1) + tl.load(len_ptr + cf + nsub - 1)
    r = tl.arange(0, BC)
    tm = r < (s_end - s0) // NH                 # the chunk's tokens
    tok = s0 // NH + r
    sq = s0 + r * NH + NH - 1                   # each token's last sub-step: its query row
    ck = tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    qr = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=tm[:, None] & (ck < K)[None, :],
                 other=0.)
    if HS_CHUNK:
        hi = cf                                 # int64, from the chunk table
    else:
        hi = tc
    st = tl.load(hs + ((hi * H + h) * K + ck[:, None]) * V + cv[None, :],
                 mask=(ck < K)[:, None] & (cv < V)[None, :], other=0.)
    if not RAW_H:
        st = st.to(tl.float32)
    if USE_G:
        # the query's gate from the token chunk's start: its chunk-local value plus the totals of
        # the chunks before its own
        Gq = tl.load(gcum + sq * H + h, mask=tm, other=0.)
        for i in tl.static_range(NH - 1):
            ci = cf + i
            before = i < nsub - 1
            last = tl.load(start_ptr + ci, mask=before, other=0) + tl.load(len_ptr + ci, mask=before, other=1) - 1
            tot = tl.load(gcum + last * H + h, mask=before, other=0.)
            Gq += tl.where((sq - s0) // BC > i, tot, 0.)
    else:
        Gq = tl.zeros([BC], dtype=tl.float32)
    if RAW_H:
        out = tl.dot(qr, st, input_precision=DOT) * (scale * tl.exp(Gq))[:, None]
    else:
        qq = qr.to(tl.float32) * (scale * tl.exp(Gq))[:, None]
        out = tl.dot(qq, st, input_precision=DOT)
    goff = 0.
    for i in tl.static_range(NH):
        ci = cf + i
        live = i < nsub
        start = tl.load(start_ptr + ci, mask=live, other=0)
        ln = tl.load(len_ptr + ci, mask=live, other=0)
        rm = r < ln
        s = start + r
        kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                     other=0.)
        vnew = tl.load(vn + (s * H + h)[:, None] * V + cv[None, :],
                       mask=rm[:, None] & (cv < V)[None, :], other=0.).to(tl.float32)
        if USE_G:
            Gs = goff + tl.load(gcum + s * H + h, mask=rm, other=0.)
            goff += tl.load(gcum + (start + ln - 1) * H + h, mask=live & (ln > 0), other=0.)
        else:
            Gs = tl.zeros([BC], dtype=tl.float32)
        causal = (sq[:, None] >= s[None, :]) & rm[None, :]
        gam = tl.exp(tl.where(causal, Gq[:, None] - Gs[None, :], float("-inf"))) * scale
        P = dot_abt(qr, kr, DOT, RAW) * gam
        out += tl.dot(P, vnew, input_precision=DOT)
    tl.store(o + (tok * H + h)[:, None] * V + cv[None, :], out.to(o.dtype.element_ty),
             mask=tm[:, None] & (cv < V)[None, :])
