"""Sequential-over-chunks kernels with the WY products fused in (``function.TUNE["fuse_wu"]``).

``W = A diag(βγ) K`` and ``U = A diag(β) V`` are never stored: each program (one sequence, head and
V tile) reads the chunk's fp32 inverse ``A`` (tri_inv64 / wy_fwd), ``K``, its ``V`` tile, ``β`` and
the cumulative log-gate, and forms what it needs in fp32 registers. Two forms (constexpr ``FORM``):

* ``FORM == 1`` ("wu"): ``W = A diag(βγ) K`` ([C, K], recomputed by every V tile) and
  ``U = A diag(β) V`` (the program's V tile only), then ``Vn = U − W H`` as in ``state.py``. Same
  dots, same rounding as the unfused path; W and U do not depend on ``H`` (off the serial chain).
* ``FORM == 2`` ("assoc"): ``Vn = U − W H = A (diag(β) V − diag(βγ) K H)``: one [C, K]×[K, BV] and one
  [C, C]×[C, BV] dot, no W at all (no extra FLOPs over the unfused path), but the ``A`` dot sits on
  the serial chain and the rounding differs (``U − W H`` cancels after, here before, the ``A`` dot).

The backward kernel needs ``W^T dVn``: ``FORM == 1`` recomputes ``W``; ``FORM == 2`` uses
``W^T dVn = (diag(βγ) K)^T (A^T dVn)``. TUNING.md "Fused W/U" has the FLOP/byte count.
``FORM == 2`` puts every row scaling (β, the gates) on the ``[C, BV]`` side of its dot instead of
scaling copies of the ``[C, K]`` keys and queries: ``(diag(βγ) K) H = diag(βγ) (K H)``, etc. (fewer
live fp32 tiles: the gated forward's sm_90a spills 360 -> 212 bytes per thread; on an H100 the gated
forward took 0.891x the time of the scaled-copy form, 2026-11-25; TUNING.md "Register spills").
``FORM == 1`` keeps the scaled copies (it forms ``W`` from them)."""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def _chunk_wy_in(k, beta, Ainv, c, h, s, rm, r, ck, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr):
    """Per chunk: ``A`` (all of it: the inverse kernels write every element; stored fp32, or fp16 under
    ``TUNE["a_16bit"]``), keys, ``β``, all as fp32."""
    A = tl.load(Ainv + ((c * H + h) * BC + r[:, None]) * BC + r[None, :]).to(tl.float32)
    b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
    kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32)
    return A, kk, b


@triton.jit
def state_fwd_fused_kernel(k, v, beta, gcum, Ainv, h0, hs, vn, hT, start_ptr, len_ptr, seq_ptr,
                           H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           USE_G: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                           FORM: tl.constexpr, DOT: tl.constexpr,
                           tseq_ptr=None, HS_EVERY: tl.constexpr = 1, HS_PRED: tl.constexpr = False,
                           hs_desc=None, TMA_HS: tl.constexpr = False, vn_desc=None,
                           TMA_VN: tl.constexpr = False):
    """``Vn = U − W H`` with ``W``, ``U`` formed here, ``H ← γ_C H + (diag(γ_C/γ) K)^T Vn``;
    stores the chunk-start states ``H``, ``Vn`` and the final state (as ``state_fwd_kernel``).
    FORM 2: the row scalings ``diag(βγ)``, ``diag(γ_C/γ)`` go on the ``[C, BV]`` side of each dot
    instead of the ``[C, K]`` keys (no scaled copies of the key tile).
    ``HS_EVERY = n_h`` (``TUNE["token_chunk_output"]``): ``H`` is stored at the start of every
    ``n_h``-th chunk of a sequence only (token-chunk starts, indexed from ``tseq_ptr``), for
    ``output_tok_fwd_kernel``: ``n_h`` times fewer state bytes written and read. ``HS_PRED``
    (``TUNE["token_state_pred"]``): that store predicated instead of branched. ``TMA_HS``
    (``HS_EVERY == 1`` only, ``TUNE["state_fwd_tma_hs"]``): ``H`` stored through the descriptor
    ``hs_desc`` (``[NC·H, K, V]``, blocks ``[1, BK, BV]``), as ``state_bwd_fused_kernel``'s
    ``TMA_DH``. ``TMA_VN`` (every chunk full, ``TUNE["state_fwd_tma_vn"]``): ``Vn`` stored through
    ``vn_desc`` (``[Ls, H, V]``, blocks ``[BC, 1, BV]`` at the chunk's first row)."""
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
    if HS_EVERY != 1:
        t0 = tl.load(tseq_ptr + n)
    for c in range(c0, c1):
        start = tl.load(start_ptr + c)
        ln = tl.load(len_ptr + c)
        rm = r < ln
        s = start + r
        mv = rm[:, None] & (cv < V)[None, :]
        if TMA_HS:
            hs_desc.store([(c * H + h).to(tl.int32), 0, iv * BV], st.to(hs_desc.dtype).reshape(1, BK, BV))
        elif HS_EVERY == 1:
            tl.store(hs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :], st.to(hs.dtype.element_ty),
                     mask=kvm)
        elif HS_PRED:
            # a predicated store, not a branch: with `if` the ungated kernel spilled 696 / 672 B a
            # thread, with the mask 152 / 128 (HS_EVERY = 1: 120-208; sm_90a, Triton 3.6's ptxas,
            # K=V=128). The predicate is a [BK, 1] tile (a scalar mask fails in the interpreter):
            # all true at a token chunk's first chunk, all false at the others
            tc = t0 + (c - c0) // HS_EVERY
            first = (ck < K - ((c - c0) % HS_EVERY) * K)[:, None]
            tl.store(hs + ((tc * H + h) * K + ck[:, None]) * V + cv[None, :], st.to(hs.dtype.element_ty),
                     mask=kvm & first)
        elif (c - c0) % HS_EVERY == 0:
            tc = t0 + (c - c0) // HS_EVERY
            tl.store(hs + ((tc * H + h) * K + ck[:, None]) * V + cv[None, :], st.to(hs.dtype.element_ty),
                     mask=kvm)
        A, kk, b = _chunk_wy_in(k, beta, Ainv, c, h, s, rm, r, ck, H, K, BC)
        vv = tl.load(v + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
        if USE_G:
            G = tl.load(gcum + s * H + h, mask=rm, other=0.)
            gC = tl.load(gcum + (start + ln - 1) * H + h)
            bg = b * tl.exp(G)
        else:
            bg = b
        if FORM == 1:
            w = tl.dot(A, kk * bg[:, None], input_precision=DOT)          # [C, K], fp32
            u = tl.dot(A, vv * b[:, None], input_precision=DOT)           # [C, BV], fp32
            vnew = u - tl.dot(w, st, input_precision=DOT)
        else:   # (diag(βγ) K) H = diag(βγ) (K H)
            y = vv * b[:, None] - bg[:, None] * tl.dot(kk, st, input_precision=DOT)
            vnew = tl.dot(A, y, input_precision=DOT)
        if TMA_VN:
            vn_desc.store([start.to(tl.int32), h.to(tl.int32), iv * BV],
                          vnew.to(vn_desc.dtype).reshape(BC, 1, BV))
        else:
            tl.store(vn + (s * H + h)[:, None] * V + cv[None, :], vnew.to(vn.dtype.element_ty), mask=mv)
        if FORM == 2:   # (diag(γ_C/γ) K)^T Vn = K^T (diag(γ_C/γ) Vn)
            vd = vnew
            if USE_G:
                vd = vnew * tl.exp(gC - G)[:, None]
                st = st * tl.exp(gC)
            st += tl.dot(tl.trans(kk), vd, input_precision=DOT)
        else:
            if USE_G:
                kk = kk * tl.exp(gC - G)[:, None]
                st = st * tl.exp(gC)
            st += tl.dot(tl.trans(kk), vnew, input_precision=DOT)
    if STORE_HT:
        tl.store(hT + ((n * H + h) * K + ck[:, None]) * V + cv[None, :], st, mask=kvm)


@triton.jit
def _local_dv(q, k, do, G, s, h, rm, r, ck, cv, scale, H: tl.constexpr, K: tl.constexpr,
              V: tl.constexpr, NH: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr,
              USE_G: tl.constexpr):
    """The chunk's intra-chunk part of ``dVn``, ``P^T dO`` with ``P = (Q K^T) ⊙ Γ · scale`` (what
    ``state.dv_local_kernel`` writes), for ``TUNE["state_bwd_local_dv"]``: off the serial chain."""
    qm = rm & (s % NH == NH - 1)
    tok = s // NH
    qr = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :], other=0.)
    kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :], other=0.)
    dout = tl.load(do + (tok * H + h)[:, None] * V + cv[None, :], mask=qm[:, None] & (cv < V)[None, :],
                   other=0.).to(tl.float32)
    causal = r[:, None] >= r[None, :]
    if USE_G:
        gam = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf"))) * scale
    else:
        gam = tl.where(causal, scale, 0.)
    P = dot_abt(qr, kr, DOT, RAW) * gam
    return tl.dot(tl.trans(P), dout, input_precision=DOT)


@triton.jit
def _state_bwd_lean_step(q, k, beta, gcum, Ainv, do, dvn, dst, c, h, s, start, ln, rm, mv, r, ck, cv,
                         scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                         BC: tl.constexpr, USE_G: tl.constexpr, DOT: tl.constexpr,
                         RELOAD_K: tl.constexpr, STORE_ATDV: tl.constexpr, x_desc=None,
                         TMA_X: tl.constexpr = False, iv=0, BV: tl.constexpr = 16,
                         LOCAL_DV: tl.constexpr = False, RAW: tl.constexpr = False):
    """One chunk of the FORM 2 backward with ``LEAN`` (see ``state_bwd_fused_kernel``): returns
    ``γ_C dH' − K^T (diag(βγ) A^T dVn) + Q^T (diag(γ) scale dO)`` and stores ``dVn`` (``A^T dVn``
    with ``STORE_ATDV``). ``RELOAD_K``: the key tile is loaded again (an L2 hit) for its second dot
    instead of being kept live across the ``A^T dVn`` dot. ``TMA_X`` (with ``STORE_ATDV``, every
    chunk full, ``TUNE["state_bwd_tma_x"]``): ``A^T dVn`` stored through ``x_desc`` as ``TMA_VN``
    stores ``Vn`` in the forward."""
    A, kk, b = _chunk_wy_in(k, beta, Ainv, c, h, s, rm, r, ck, H, K, BC)
    kdst = tl.dot(kk, dst, input_precision=DOT)                          # K dH', [C, BV]
    if USE_G:
        G = tl.load(gcum + s * H + h, mask=rm, other=0.)
        gC = tl.load(gcum + (start + ln - 1) * H + h)
        kdst = kdst * tl.exp(gC - G)[:, None]
        b = b * tl.exp(G)
        dst = dst * tl.exp(gC)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
    if LOCAL_DV:
        dv_ = _local_dv(q, k, do, G, s, h, rm, r, ck, cv, scale, H, K, V, NH, DOT, RAW, USE_G) + kdst
    else:
        dv_ = tl.load(dvn + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.) + kdst
    if STORE_ATDV:
        x = tl.dot(tl.trans(A), dv_, input_precision=DOT)                # A^T dVn
        if TMA_X:
            x_desc.store([start.to(tl.int32), h.to(tl.int32), iv * BV], x.reshape(BC, 1, BV))
        else:
            tl.store(dvn + (s * H + h)[:, None] * V + cv[None, :], x, mask=mv)
        t = x * (-b)[:, None]
    else:
        tl.store(dvn + (s * H + h)[:, None] * V + cv[None, :], dv_, mask=mv)
        t = tl.dot(tl.trans(A), dv_, input_precision=DOT) * (-b)[:, None]  # −diag(βγ) A^T dVn
    if RELOAD_K:
        kk = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=rm[:, None] & (ck < K)[None, :],
                     other=0.).to(tl.float32)
    dst = tl.dot(tl.trans(kk), t, acc=dst, input_precision=DOT)
    qm = rm & (s % NH == NH - 1)
    tok = s // NH
    qq = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32)
    ds = tl.load(do + (tok * H + h)[:, None] * V + cv[None, :], mask=qm[:, None] & (cv < V)[None, :],
                 other=0.).to(tl.float32)
    if USE_G:
        ds = ds * (scale * tl.exp(G))[:, None]
    else:
        ds = ds * scale
    return tl.dot(tl.trans(qq), ds, acc=dst, input_precision=DOT)


@triton.jit
def state_bwd_fused_kernel(q, k, beta, gcum, Ainv, do, dhT, dhs, dvn, dh0, start_ptr, len_ptr, seq_ptr,
                           scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NH: tl.constexpr,
                           BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           USE_G: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                           FORM: tl.constexpr, DOT: tl.constexpr, LEAN: tl.constexpr = False,
                           RELOAD_K: tl.constexpr = False, STORE_ATDV: tl.constexpr = False,
                           dhs_desc=None, TMA_DH: tl.constexpr = False, x_desc=None,
                           TMA_X: tl.constexpr = False, LOCAL_DV: tl.constexpr = False,
                           RAW: tl.constexpr = False):
    """``state_bwd_kernel`` without a stored ``W``: ``dVn += diag(γ_C/γ) K dH'`` (``dvn`` holds
    ``P^T dO``), ``dH = γ_C dH' + (diag(γ) Q)^T dO − W^T dVn``; stores ``dH'`` per chunk and ``dH_0``.
    FORM 2: the row scalings go on the ``[C, BV]`` side of each dot, as in the forward.
    ``LEAN`` (FORM 2 only, ``function.TUNE["state_bwd_lean"]``): the same sums in an order that keeps
    fewer fp32 tiles live: ``Q`` and ``dO`` are loaded after the ``W^T dVn`` dot, ``scale`` goes on
    ``dO`` (a ``[C, BV]`` tile) instead of ``Q`` (``[C, K]``), and both dots accumulate into the
    decayed state (``acc=``) so no ``[K, BV]`` partial result is live beside it. ``RELOAD_K`` (LEAN
    only, ``TUNE["state_bwd_reload_k"]``): see ``_state_bwd_lean_step``. ``STORE_ATDV`` (FORM 2
    only, ``TUNE["wy_bwd_vn"]``): ``dvn`` receives ``A^T dVn``, which the dot below forms anyway,
    in place of ``dVn``; the later kernels need nothing else (wy_bwd_vn.py). ``TMA_DH``
    (``TUNE["state_bwd_tma_dh"]``): ``dH'`` is stored through the tensor descriptor ``dhs_desc``
    (``[NC·H, K, V]``, blocks ``[1, BK, BV]``) from shared memory, instead of the fp32 tile being
    converted out of the MMA layout for a coalesced store every chunk."""
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
        mv = rm[:, None] & (cv < V)[None, :]
        if TMA_DH:
            dhs_desc.store([(c * H + h).to(tl.int32), 0, iv * BV],
                           dst.to(dhs_desc.dtype).reshape(1, BK, BV))
        else:
            tl.store(dhs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :], dst.to(dhs.dtype.element_ty),
                     mask=kvm)
        if LEAN:
            dst = _state_bwd_lean_step(q, k, beta, gcum, Ainv, do, dvn, dst, c, h, s, start, ln, rm, mv,
                                       r, ck, cv, scale, H, K, V, NH, BC, USE_G, DOT, RELOAD_K,
                                       STORE_ATDV, x_desc, TMA_X, iv, BV, LOCAL_DV, RAW)
        else:
            qm = rm & (s % NH == NH - 1)
            tok = s // NH
            qq = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :],
                         mask=qm[:, None] & (ck < K)[None, :], other=0.).to(tl.float32) * scale
            dout = tl.load(do + (tok * H + h)[:, None] * V + cv[None, :],
                           mask=qm[:, None] & (cv < V)[None, :], other=0.).to(tl.float32)
            A, kk, b = _chunk_wy_in(k, beta, Ainv, c, h, s, rm, r, ck, H, K, BC)
            dvl = tl.load(dvn + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.)
            if USE_G:
                G = tl.load(gcum + s * H + h, mask=rm, other=0.)
                gC = tl.load(gcum + (start + ln - 1) * H + h)
                dst_dec = dst * tl.exp(gC)
            else:
                dst_dec = dst
            if FORM == 2:
                # diag(γ_C/γ) (K dH'), Q^T (diag(γ) dO), K^T (diag(βγ) A^T dVn): only [C, BV]
                # tiles scaled
                kdst = tl.dot(kk, dst, input_precision=DOT)
                bgs = b
                if USE_G:
                    eG = tl.exp(G)
                    kdst = kdst * tl.exp(gC - G)[:, None]
                    dout = dout * eG[:, None]
                    bgs = b * eG
                dv_ = dvl + kdst
            else:
                if USE_G:
                    kb = kk * (b * tl.exp(G))[:, None]                              # diag(βγ) K
                    kd = kk * tl.exp(gC - G)[:, None]
                    qq = qq * tl.exp(G)[:, None]
                else:
                    kb = kk * b[:, None]
                    kd = kk
                dv_ = dvl + tl.dot(kd, dst, input_precision=DOT)
            if FORM == 2:
                x = tl.dot(tl.trans(A), dv_, input_precision=DOT)             # A^T dVn
                tl.store(dvn + (s * H + h)[:, None] * V + cv[None, :], x if STORE_ATDV else dv_, mask=mv)
                wtd = tl.dot(tl.trans(kk), x * bgs[:, None], input_precision=DOT)
            else:
                tl.store(dvn + (s * H + h)[:, None] * V + cv[None, :], dv_, mask=mv)
                w = tl.dot(A, kb, input_precision=DOT)
                wtd = tl.dot(tl.trans(w), dv_, input_precision=DOT)
            dst = dst_dec + tl.dot(tl.trans(qq), dout, input_precision=DOT) - wtd
    if STORE_DH0:
        tl.store(dh0 + ((n * H + h) * K + ck[:, None]) * V + cv[None, :], dst, mask=kvm)
