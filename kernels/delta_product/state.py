"""Sequential-over-chunks kernels (one program per sequence, head and V tile).

* ``state_fwd_kernel``: ``Vn = U − W H``, ``H ← γ_C H + (diag(γ_C/γ) K)^T Vn``; stores the chunk-start
  states ``H`` and the pseudo-values ``Vn`` (fp32), and the final state.
* ``state_bwd_kernel``: with ``dH'`` the gradient of the chunk-end state,
  ``dVn = P^T dO + diag(γ_C/γ) K dH'`` (``P = (Q K^T) ⊙ Γ ⊙ M`` with the scaled, masked queries),
  ``dH = γ_C dH' + (diag(γ) Q)^T dO − W^T dVn``; stores ``dH'`` per chunk, ``dVn`` and ``dH_0``.
"""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def state_fwd_kernel(k, W, U, gcum, h0, hs, vn, hT, start_ptr, len_ptr, seq_ptr,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     USE_G: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                     DOT: tl.constexpr):
    iv = tl.program_id(0)
    nh = tl.program_id(1).to(tl.int64)  # sequence·H + head: (n·H + h)·K·V passes 2^31
    n = nh // H
    h = nh % H
    ck = tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    kvm = (ck < K)[:, None] & (cv < V)[None, :]
    r = tl.arange(0, BC)
    if USE_H0:
        st = tl.load(h0 + ((n * H + h) * K + ck[:, None]) * V + cv[None, :], mask=kvm, other=0.).to(tl.float32)
    else:
        st = tl.zeros([BK, BV], dtype=tl.float32)
    c0 = tl.load(seq_ptr + n)
    c1 = tl.load(seq_ptr + n + 1)
    for c in range(c0, c1):
        start = tl.load(start_ptr + c)
        ln = tl.load(len_ptr + c)
        rm = r < ln
        s = start + r
        tl.store(hs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :], st.to(hs.dtype.element_ty), mask=kvm)
        # W, U may be stored in 16 bits (function.TUNE["inter_16bit"]); the recurrence stays fp32
        w = tl.load(W + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                    other=0.).to(tl.float32)
        u = tl.load(U + (s * H + h)[:, None] * V + cv[None, :], mask=rm[:, None] & (cv < V)[None, :],
                    other=0.).to(tl.float32)
        kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                     other=0.).to(tl.float32)
        vnew = u - tl.dot(w, st, input_precision=DOT)
        tl.store(vn + (s * H + h)[:, None] * V + cv[None, :], vnew.to(vn.dtype.element_ty),
                 mask=rm[:, None] & (cv < V)[None, :])
        if USE_G:
            G = tl.load(gcum + s * H + h, mask=rm, other=0.)
            gC = tl.load(gcum + (start + ln - 1) * H + h)
            kk = kk * tl.exp(gC - G)[:, None]
            st = st * tl.exp(gC)
        st += tl.dot(tl.trans(kk), vnew, input_precision=DOT)
    if STORE_HT:
        tl.store(hT + ((n * H + h) * K + ck[:, None]) * V + cv[None, :], st, mask=kvm)


@triton.jit
def dv_local_kernel(q, k, gcum, do, dvn, start_ptr, len_ptr, scale,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                    BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr, BVL: tl.constexpr):
    """Parallel over chunks: the intra-chunk part ``P^T dO`` of ``dVn`` (written to ``dvn``).
    ``P`` is formed once per program; its ``BV`` value columns go out ``BVL`` at a time
    (``function.TUNE["dv_local_bvl"]``): below ``BV``, a loop whose ``dO`` loads the launch's
    stages can run ahead of the dots and stores; at ``BV``, one straight pass."""
    iv = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)   # chunk: int64 offsets
    h = tl.program_id(2)
    start = tl.load(start_ptr + c)
    ln = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < ln
    s = start + r
    ck = tl.arange(0, BK)
    qm = rm & (s % NH == NH - 1)
    tok = s // NH
    qr = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :],
                 other=0.)
    kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                 other=0.)
    if BVL == BV:   # one pass: its dO tile loaded before P is formed
        dout = _dv_local_load_do(do, iv * BV, tok, qm, h, H, V, BV)
    if USE_G:
        G = tl.load(gcum + s * H + h, mask=rm, other=0.)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
    causal = r[:, None] >= r[None, :]
    gam = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf"))) * scale
    # Q K^T on the inputs' own dtype: exact for 16-bit inputs (fp32 accumulate), scale applied after
    P = dot_abt(qr, kr, DOT, RAW) * gam
    if BVL == BV:
        cv = iv * BV + tl.arange(0, BV)
        tl.store(dvn + (s * H + h)[:, None] * V + cv[None, :], tl.dot(tl.trans(P), dout, input_precision=DOT),
                 mask=rm[:, None] & (cv < V)[None, :])
    else:
        Pt = tl.trans(P)
        for v0 in range(iv * BV, iv * BV + BV, BVL):
            cv = v0 + tl.arange(0, BVL)
            dout = _dv_local_load_do(do, v0, tok, qm, h, H, V, BVL)
            tl.store(dvn + (s * H + h)[:, None] * V + cv[None, :], tl.dot(Pt, dout, input_precision=DOT),
                     mask=rm[:, None] & (cv < V)[None, :])


@triton.jit
def _dv_local_load_do(do, v0, tok, qm, h, H: tl.constexpr, V: tl.constexpr, BVL: tl.constexpr):
    """``dO[:, v0 : v0 + BVL]`` of one chunk's query rows (zero elsewhere), as fp32."""
    cv = v0 + tl.arange(0, BVL)
    return tl.load(do + (tok * H + h)[:, None] * V + cv[None, :], mask=qm[:, None] & (cv < V)[None, :],
                   other=0.).to(tl.float32)


@triton.jit
def state_bwd_kernel(q, k, W, gcum, do, dhT, dhs, dvn, dh0, start_ptr, len_ptr, seq_ptr, scale,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                     BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     USE_G: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                     DOT: tl.constexpr):
    """Sequential over chunks (reverse): ``dVn += diag(γ_C/γ) K dH'`` (``dvn`` holds ``P^T dO``),
    ``dH = γ_C dH' + (diag(γ) Q)^T dO − W^T dVn``; stores ``dH'`` per chunk and ``dH_0``."""
    iv = tl.program_id(0)
    nh = tl.program_id(1).to(tl.int64)  # sequence·H + head: (n·H + h)·K·V passes 2^31
    n = nh // H
    h = nh % H
    ck = tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    kvm = (ck < K)[:, None] & (cv < V)[None, :]
    r = tl.arange(0, BC)
    if USE_DHT:
        dst = tl.load(dhT + ((n * H + h) * K + ck[:, None]) * V + cv[None, :], mask=kvm, other=0.).to(tl.float32)
    else:
        dst = tl.zeros([BK, BV], dtype=tl.float32)
    c0 = tl.load(seq_ptr + n)
    c1 = tl.load(seq_ptr + n + 1)
    for i in range(0, c1 - c0):
        c = c1 - 1 - i
        start = tl.load(start_ptr + c)
        ln = tl.load(len_ptr + c)
        rm = r < ln
        s = start + r
        tl.store(dhs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :], dst.to(dhs.dtype.element_ty), mask=kvm)
        qm = rm & (s % NH == NH - 1)
        tok = s // NH
        qq = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :],
                     other=0.).to(tl.float32) * scale
        dout = tl.load(do + (tok * H + h)[:, None] * V + cv[None, :], mask=qm[:, None] & (cv < V)[None, :],
                       other=0.).to(tl.float32)
        kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                     other=0.).to(tl.float32)
        w = tl.load(W + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                    other=0.).to(tl.float32)
        dvl = tl.load(dvn + (s * H + h)[:, None] * V + cv[None, :], mask=rm[:, None] & (cv < V)[None, :], other=0.)
        if USE_G:
            G = tl.load(gcum + s * H + h, mask=rm, other=0.)
            gC = tl.load(gcum + (start + ln - 1) * H + h)
            kk = kk * tl.exp(gC - G)[:, None]
            qq = qq * tl.exp(G)[:, None]
            dst_dec = dst * tl.exp(gC)
        else:
            dst_dec = dst
        dv_ = dvl + tl.dot(kk, dst, input_precision=DOT)
        tl.store(dvn + (s * H + h)[:, None] * V + cv[None, :], dv_, mask=rm[:, None] & (cv < V)[None, :])
        dst = dst_dec + tl.dot(tl.trans(qq), dout, input_precision=DOT) - tl.dot(tl.trans(w), dv_, input_precision=DOT)
    if STORE_DH0:
        tl.store(dh0 + ((n * H + h) * K + ck[:, None]) * V + cv[None, :], dst, mask=kvm)
