"""Backward, part 1 (parallel over chunks, loops over V tiles): gradients through the read-out
``O = diag(γ) Q H + P Vn`` and the state update ``H' = γ_C H + (diag(γ_C/γ) K)^T Vn``.

Produces ``dq`` (final), the read-out/state part of ``dk``, ``dW = −dVn H^T`` and the part of the
gradient of the chunk-local cumulative log-gate ``G`` that comes from these two equations
(``dGp``, the ``γ_C`` term included at the chunk's last row). README.md has the derivation. By
default (``ATDV``, ``TUNE["wy_bwd_vn"]``) ``dvn`` holds ``A^T dVn`` and the ``A^T dW`` terms are
folded into ``dk``, ``dGp`` and a partial ``dβ`` instead of storing ``dW`` (wy_bwd_vn.py).

``KS`` programs a chunk can split K (``function.TUNE["dqkwg_ksplit"]``; two by default): program
``ks`` owns K columns ``[ks BK, (ks + 1) BK)`` (the launcher passes the slice width as ``BK``)
and recomputes ``dP = dO Vn^T``, which does not depend on K. Every ``dG`` term is a sum over K
(``Q H``, ``Q K^T``, ``<K~, dK~>``, ``<H, dH'>``), so each slice writes its partial ``dG`` to
``dGp + ks * GSTRIDE`` and the launcher adds the slices. Fewer fp32 accumulators per program
(three ``[BC, BK]`` tiles and ``dP``) at the cost of reading ``Vn``, ``dVn`` and ``dO`` once per
slice; the slices of a chunk run next to each other in launch order (``KS_ADJ``), so the second
read mostly hits L2.

The gate term ``rowsum((Q H) ⊙ dO)`` is read as ``rowsum(Q ⊙ (dO H^T))`` off the ``dO H^T``
accumulator that ``dq`` needs anyway, not from a ``Q H`` dot per V tile, and ``dW`` is stored right
after the loop: for sm_90a (Triton 3.6's ptxas, K = V = 128) the gated kernel's spills went from
300-308 / 244-252 bytes per thread to none and its shared memory from 196 to 120 KiB; on an H100
the gated forward+backward took 0.885x the time of the ``Q H`` form (2026-11-25, TUNING.md). The
``Q H`` form was removed after that run; its GPU numbers are in benchmarks/RESULTS.md.

The gated sum has a shorter form (``DG_GRADS``, the default since 2026-11-26: 0.97-0.98x the
gated fwd+bwd time on an H200, TUNING.md): with ``Q~ = scale Q`` and this program's
``dQ~ = γ ⊙ dO H^T + dP~ K`` and ``dK~ = dP~^T Q~ + (γ_C/γ) ⊙ Vn dH'^T``,
``rowsum(Q~ ⊙ dQ~) − rowsum(K ⊙ dK~) = γ ⊙ rowsum(Q~ ⊙ dO H^T) + rowsum(Z) − colsum(Z) − <K~, dK~>``
(``Z = dP~ ⊙ Q~ K^T``), the gate gradient that fla also reads off ``q ⊙ dq − k ⊙ dk``.
"""
import triton
import triton.language as tl

from .mm import dot_abt


@triton.jit
def dqkwg_bwd_kernel(q, k, v, beta, gcum, hs, vn, dvn, dhs, do, dq, dk, dv, dW, dGp, dbp, start_ptr,
                     len_ptr, scale, GSTRIDE, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     NH: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     USE_G: tl.constexpr, DOT: tl.constexpr, RAW: tl.constexpr,
                     DG_GRADS: tl.constexpr = False, RAW_H: tl.constexpr = False,
                     KS_ADJ: tl.constexpr = 0, ATDV: tl.constexpr = False,
                     FUSE_WY: tl.constexpr = False, NKS: tl.constexpr = 1, dk_desc=None,
                     TMA_DK: tl.constexpr = False):
    """``DG_GRADS`` (``function.TUNE["dqkwg_dg_grads"]``): the gate term read off this program's
    own gradients, ``dG = rowsum(Q ⊙ dQ) − rowsum(K ⊙ dK)`` (module docstring), instead of
    ``γ ⊙ rowsum(Q ⊙ dO H^T) + rowsum(Z) − colsum(Z) − <K~, dK~>`` with ``Z = dP~ ⊙ Q K^T``: no
    second ``Q K^T`` dot and no ``[BC, BC]`` row and column sums. ``RAW_H``
    (``TUNE["dqkwg_raw_h"]``; ``dO`` and the stored ``H`` both 16-bit of one dtype): ``dO H^T`` on
    the two tiles as loaded (exact products, fp32 accumulate, as the tf32 dot of their fp32
    copies gives, at twice its MMA rate). ``KS_ADJ > 0`` (``TUNE["dqkwg_slices_adjacent"]``): the grid
    is ``(NC · KS_ADJ, H)`` with the ``KS_ADJ`` K slices of a chunk next to each other in launch order,
    so that the second slice's reads of ``Vn``, ``dVn`` and ``dO`` can find them in L2 (with the
    slices on a third grid axis, ``NC · H`` programs run between them): 0.93-0.94x the kernel's
    time on an H200 (sixtieth session, TUNING_LOG.md). ``ATDV`` (``TUNE["wy_bwd_vn"]``): ``dvn``
    holds ``A^T dVn`` (state_fused.py ``STORE_ATDV``), so the accumulator is ``A^T dW`` instead of
    ``dW``; it is not stored but folded in here: ``dk`` gets ``diag(βγ) A^T dW``, ``dbp`` (this
    slice's partial ``dβ``) ``γ ⊙ rowsum(K ⊙ A^T dW)`` and ``dGp`` ``βγ ⊙`` the same row sums
    (``beta`` and ``dbp`` are read only then; ``dW`` only without it). ``FUSE_WY`` (with ``ATDV``,
    ``TUNE["dqkwg_fuse_wy"]``): ``wy_bwd_vn_kernel``'s work as well, so ``dk`` is final (no fp32
    partial in HBM): ``X Vn^T`` accumulates beside ``dO Vn^T`` in the V loop, each of the ``NKS``
    slices stores ``dV = diag(β) X`` for every ``NKS``-th V tile, and adds ``(dS + dS^T) K`` to its
    ``dk`` columns and its share of ``rowsum(E ⊙ K K^T)``, ``rowsum(Z) − colsum(Z)`` to the partials
    (``wy_bwd_vn.wy_partials_kernel`` sums them)."""
    # chunk c as int64: offsets (c·H + h)·K·V pass 2^31; ks: this program's K slice
    if KS_ADJ > 0:
        c = (tl.program_id(0) // KS_ADJ).to(tl.int64)
        ks = tl.program_id(0) % KS_ADJ
    else:
        c = tl.program_id(0).to(tl.int64)
        ks = tl.program_id(2)               # 0 unless the grid splits K
    h = tl.program_id(1)
    start = tl.load(start_ptr + c)
    ln = tl.load(len_ptr + c)
    r = tl.arange(0, BC)
    rm = r < ln
    s = start + r
    ck = ks * BK + tl.arange(0, BK)
    mk = rm[:, None] & (ck < K)[None, :]
    qm = rm & (s % NH == NH - 1)
    tok = s // NH
    dP = tl.zeros([BC, BC], dtype=tl.float32)
    dqh = tl.zeros([BC, BK], dtype=tl.float32)     # dO H^T
    dkt = tl.zeros([BC, BK], dtype=tl.float32)     # Vn dH'^T
    dw = tl.zeros([BC, BK], dtype=tl.float32)      # -dVn H^T (ATDV: -A^T dVn H^T = A^T dW)
    sdh = tl.zeros([BK], dtype=tl.float32)         # <H, dH'> partial sums
    if FUSE_WY:
        b = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
        xv = tl.zeros([BC, BC], dtype=tl.float32)  # X Vn^T
        dbv = tl.zeros([BC], dtype=tl.float32)     # rowsum(V ⊙ X) over this slice's V tiles
    for v0 in range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        mv = rm[:, None] & (cv < V)[None, :]
        mkv = (ck < K)[:, None] & (cv < V)[None, :]
        # H, Vn, dH may be stored in 16 bits (function.TUNE); all products accumulate in fp32
        st_in = tl.load(hs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :], mask=mkv, other=0.)
        st = st_in.to(tl.float32)
        dst = tl.load(dhs + ((c * H + h) * K + ck[:, None]) * V + cv[None, :], mask=mkv, other=0.).to(tl.float32)
        vnew = tl.load(vn + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.).to(tl.float32)
        dvnew = tl.load(dvn + (s * H + h)[:, None] * V + cv[None, :], mask=mv, other=0.)
        dout_in = tl.load(do + (tok * H + h)[:, None] * V + cv[None, :], mask=qm[:, None] & (cv < V)[None, :],
                          other=0.)
        dout = dout_in.to(tl.float32)
        dP += tl.dot(dout, tl.trans(vnew), input_precision=DOT)
        if RAW_H:
            dqh += tl.dot(dout_in, tl.trans(st_in), input_precision=DOT)
        else:
            dqh += tl.dot(dout, tl.trans(st), input_precision=DOT)
        dkt += tl.dot(vnew, tl.trans(dst), input_precision=DOT)
        dw -= tl.dot(dvnew, tl.trans(st), input_precision=DOT)
        sdh += tl.sum(st * dst, 1)
        if FUSE_WY:
            xv += tl.dot(dvnew, tl.trans(vnew), input_precision=DOT)
            mo = mv & ((cv // BV) % NKS == ks)[None, :]    # this slice's V tiles: dV stored once
            vv = tl.load(v + (s * H + h)[:, None] * V + cv[None, :], mask=mo, other=0.).to(tl.float32)
            tl.store(dv + (s * H + h)[:, None] * V + cv[None, :], b[:, None] * dvnew, mask=mo)
            dbv += tl.sum(vv * dvnew, 1)
    # rowsum((Q H) ⊙ dO) = rowsum(Q ⊙ (dO H^T)), from the accumulated dO H^T: one dot fewer per
    # V tile, and Q is not live in the loop; dW is stored at once (one [BC, BK] tile less live)
    if not ATDV:
        tl.store(dW + (s * H + h)[:, None] * K + ck[None, :], dw, mask=mk)
    qq = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :],
                 other=0.).to(tl.float32) * scale
    o1 = tl.sum(qq * dqh, 1)
    kr = tl.load(k + (s * H + h)[:, None] * K + ck[None, :], mask=mk, other=0.)
    kk = kr.to(tl.float32)
    if USE_G:
        G = tl.load(gcum + s * H + h, mask=rm, other=0.)
        gC = tl.load(gcum + (start + ln - 1) * H + h)
    else:
        G = tl.zeros([BC], dtype=tl.float32)
        gC = 0.
    causal = r[:, None] >= r[None, :]
    gam = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
    eg = tl.exp(G)
    edec = tl.exp(gC - G)
    dPg = dP * gam
    dqq = eg[:, None] * dqh + tl.dot(dPg, kk, input_precision=DOT)
    if USE_G:
        dkt = dkt * edec[:, None]                  # (γ_C/γ) ⊙ Vn dH'^T
    dkk = tl.dot(tl.trans(dPg), qq, input_precision=DOT) + dkt
    tl.store(dq + (tok * H + h)[:, None] * K + ck[None, :], dqq * scale, mask=qm[:, None] & (ck < K)[None, :])
    if FUSE_WY:
        if USE_G and DG_GRADS:
            dg_qk = tl.sum(qq * dqq, 1) - tl.sum(kk * dkk, 1)         # before dk gets (dS + dS^T) K
        # E = strictLower(-X Vn^T) ⊙ Γ (wy_bwd_vn.py); this slice's K K^T columns
        E = tl.where(r[:, None] > r[None, :], -xv * gam, 0.)
        ek = E * dot_abt(kr, kr, DOT, RAW)
        dbv += tl.sum(ek, 1)
        if USE_G:
            Zl = ek * b[:, None]
            dzl = tl.sum(Zl, 1) - tl.sum(Zl, 0)
        dS = E * b[:, None]
        dkk = tl.dot(dS + tl.trans(dS), kk, acc=dkk, input_precision=DOT)
    if ATDV:
        # wy_bwd's A^T dW terms (wy_bwd_vn.py): dk += diag(βγ) A^T dW, dβ += γ ⊙ k·(A^T dW), dG +=
        # βγ ⊙ k·(A^T dW). Written so that Triton 3.6 keeps every fp32 [BC, BK] tile in the MMA
        # layout (sm_90a ttgir): γ on the tile before its row sum, the row sum kept 2-D for its
        # store, and the dG term taken inside the dk row sum below; a row sum meeting a vector in
        # another layout made it convert the whole tile through shared memory first
        bb = tl.load(beta + s * H + h, mask=rm, other=0.).to(tl.float32)
        if USE_G:
            dw = dw * eg[:, None]                                      # diag(γ) A^T dW
        kdw2 = tl.sum(kk * dw, 1, keep_dims=True)                     # this slice's γ k·(A^T dW)
        if FUSE_WY:
            kdw = tl.sum(kdw2, 1)
            tl.store(dbp + ks.to(tl.int64) * GSTRIDE + s * H + h, kdw + dbv, mask=rm)
        else:
            tl.store(dbp + ks.to(tl.int64) * GSTRIDE + (s * H + h)[:, None], kdw2, mask=rm[:, None])
        dkw = bb[:, None] * dw                                         # diag(βγ) A^T dW
        dko = dkk + dkw
    else:
        dko = dkk
    if TMA_DK:      # every chunk full (TUNE["dqkwg_tma_dk"]): from shared memory, no layout change
        dk_desc.store([start.to(tl.int32), h, (ks * BK).to(tl.int32)],
                      dko.to(dk_desc.dtype).reshape(BC, 1, BK))
    else:
        tl.store(dk + (s * H + h)[:, None] * K + ck[None, :], dko, mask=mk)
    if USE_G:
        if DG_GRADS:
            # rowsum(Q~ ⊙ dQ~) = γ ⊙ rowsum(Q~ ⊙ dO H^T) + rowsum(Z) and rowsum(K ⊙ dK~) =
            # colsum(Z) + <K~, dK~>: the same sum, from tiles already in registers
            if FUSE_WY:
                dG = dg_qk
                if ATDV:
                    dG += bb * kdw                                     # βγ k·(A^T dW)
            elif ATDV:
                dG = tl.sum(qq * dqq, 1) - tl.sum(kk * (dkk - dkw), 1)  # + βγ k·(A^T dW)
            else:
                dG = tl.sum(qq * dqq, 1) - tl.sum(kk * dkk, 1)
        else:
            # dP_raw ⊙ P; Q K^T on the inputs' dtype (exact for 16-bit inputs), scale applied after
            qr = tl.load(q + (tok * H + h)[:, None] * K + ck[None, :], mask=qm[:, None] & (ck < K)[None, :],
                         other=0.)
            Z = dPg * (dot_abt(qr, kr, DOT, RAW) * scale)
            dG = eg * o1 + tl.sum(Z, 1) - tl.sum(Z, 0) - tl.sum(dkt * kk, 1)   # <K~_r, dK~_r>
            if ATDV:
                dG += tl.sum(kk * dkw, 1)                              # βγ k·(A^T dW)
        # the γ_C terms at the chunk's last row: <H, dH'> and Σ_r <K~_r, dK~_r> (its total kept
        # 2-D: as a vector sum it, too, made the tile leave the MMA layout)
        ztt = tl.sum(tl.sum(dkt * kk, 1, keep_dims=True), 0, keep_dims=True)        # [1, 1]
        dG += tl.sum(tl.where((r == ln - 1)[:, None], ztt, 0.), 1)
        dG += tl.where(r == ln - 1, tl.sum(sdh, 0) * tl.exp(gC), 0.)
        if FUSE_WY:
            dG += dzl
        tl.store(dGp + ks.to(tl.int64) * GSTRIDE + s * H + h, dG, mask=rm)
