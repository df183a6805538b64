"""Autograd Function wiring the Triton kernels: forward (WY → states → outputs) and a native
backward that reuses the forward's chunk-start states and pseudo-values (``TUNE["save_states"]``,
the default) or recomputes them. The launch settings and storage choices it reads are ``TUNE``
(``tune.py``)."""
from __future__ import annotations

import os

import torch

from .._host import cdiv, next_pow2
from ..block_diagonal.tma import TensorDescriptor, tma_tensors_ok
from .chunks import build_chunks, build_token_chunks
from .dqkwg_bwd import dqkwg_bwd_kernel
from .output import output_fwd_kernel, output_tok_fwd_kernel
from .state import dv_local_kernel, state_bwd_kernel, state_fwd_kernel
from .state_fused import state_bwd_fused_kernel, state_fwd_fused_kernel
from .tune import (_CASE_SWITCHES, _FP32_DOTS, TUNE, _bv, _case_on, _dv_local_bvl, _fuse_form, _ksplit,
                   _regs, _store_dtype)
from .wy import wy_fwd_kernel
from .wy64 import tri_inv64_kernel, wu_fwd_kernel
from .wy_bwd import wy_bwd_kernel
from .wy_bwd_vn import wy_bwd_vn_kernel, wy_partials_kernel


def _autograd_ctx(ctx):
    """Whether ``forward`` runs as this autograd Function. The ``torch.library`` custom op of
    ``lrnn_scan.compile`` calls it with a stand-in ctx that names the W/U form itself
    (``ctx.form_request``, an argument of the op, so its fake registration knows whether ``W``,
    ``U`` exist) and returns an fp32 ``A`` (its schema says so): ``a_16bit`` does not apply there."""
    return isinstance(ctx, torch.autograd.function.FunctionCtx)


def _empty(shape, device, dtype):
    """``torch.empty``, or NaN-filled under ``LRNN_SCAN_POISON=1`` (tests: every element that is
    read is written first)."""
    if os.environ.get("LRNN_SCAN_POISON", "0") not in ("", "0"):
        return torch.full(shape, float("nan"), device=device, dtype=dtype)
    return torch.empty(shape, device=device, dtype=dtype)


def _cfg(q, k, v, chunk_size):
    K, V = q.shape[-1], v.shape[-1]
    BC = max(16, next_pow2(chunk_size))
    if BC != chunk_size:
        raise ValueError(f"chunk_size must be a power of two >= 16 for the Triton backend, got {chunk_size}")
    BK = max(16, next_pow2(K))
    BVf = max(16, next_pow2(V))
    if BK > 256 or BVf > 256:
        raise ValueError(f"the Triton backend supports K, V <= 256; got K={K}, V={V}")
    # float32 inputs: fp32-accurate dots (TUNE["fp32_dot"]) unless the user allowed TF32 matmuls
    # (torch's switch, e.g. torch.set_float32_matmul_precision("high")), as torch's own fp32
    # matmuls do.
    dot = "tf32"
    if q.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        dot = TUNE["fp32_dot"]
        if dot not in _FP32_DOTS:
            raise ValueError(f'TUNE["fp32_dot"] must be one of {_FP32_DOTS}, got {dot!r}')
    for key in _CASE_SWITCHES:       # a bad switch is refused before any launch, taken or not
        _case_on(key, False)
    return BC, BK, BVf, min(BVf, 64), dot


def _raw(x):
    """Whether input-by-input products (Q K^T, K K^T) take the 16-bit inputs as they are (mm.py):
    not for float32, and not under the CPU interpreter, whose bf16 dot is wrong."""
    return x.dtype in (torch.float16, torch.bfloat16) and os.environ.get("TRITON_INTERPRET") != "1"


def _state_desc(buf, key, use_g, arg, flag, K, V, BK, BV):
    """``{arg: descriptor, flag: True}`` for a state kernel that stores its ``[K, V]`` state tiles
    by TMA (``TUNE[key]``, ``_case_on``): a descriptor over ``buf`` (``[n, H, K, V]`` read as
    ``[n·H, K, V]``, blocks ``[1, BK, BV]``, so a ``K < BK`` tile clips at its head's rows), where
    TMA can take it (``tma_tensors_ok``: compute capability 9+ or the interpreter, 16-byte aligned
    rows); otherwise ``{}``, the plain store."""
    if not _case_on(key, use_g):
        return {}
    flat = buf.view(-1, K, V)
    if TensorDescriptor is None or not tma_tensors_ok(flat):
        return {}
    return {arg: TensorDescriptor(flat, shape=list(flat.shape), strides=[K * V, V, 1],
                                  block_shape=[1, BK, BV]), flag: True}


def _rows_desc(buf, key, use_g, arg, flag, ch, BC, BV):
    """``{arg: descriptor, flag: True}`` for a kernel that stores its ``[BC, BV]`` tiles of the
    per-sub-step rows ``buf`` (``[Ls, H, V]``: ``Vn``, ``A^T dVn`` in ``dvn``, or ``[Ls, H, K]``:
    ``dk``) by TMA (``TUNE[key]``, ``_case_on``): blocks ``[BC, 1, BV]`` at a chunk's first row. Only where
    every chunk is full (``ch["full"]``): TMA cannot mask rows, and a short chunk's tile would run
    into the next sequence's rows. Otherwise ``{}``, the plain masked store."""
    if not _case_on(key, use_g) or not ch["full"] or TensorDescriptor is None or not tma_tensors_ok(buf):
        return {}
    Ls, H, V = buf.shape
    return {arg: TensorDescriptor(buf, shape=[Ls, H, V], strides=[H * V, V, 1], block_shape=[BC, 1, BV]),
            flag: True}


def _state_fwd(k, W, U, gcum, h0, ch, H, K, V, BC, BK, BVf, use_g, want_final, dot, fused=None,
               tch=None, no_grad=False):
    """Chunk-start states, ``Vn`` and the final state. ``fused = (form, v, beta, Ainv)``: ``W``, ``U``
    are not stored and the fused kernel forms them (state_fused.py). ``tch`` (fused only, from
    :func:`build_token_chunks`): one state per token chunk instead of one per chunk. ``no_grad``:
    no backward reads ``Vn`` (``TUNE["vn_16bit"] == "no_grad"`` stores it in 16 bits then)."""
    NC, N = ch["NC"], ch["N"]
    key = "state_fused" if fused else "state_fwd"
    nw, ns, _ = TUNE[key]
    BV = _bv(key, BVf)
    hs = _empty((tch["NT"] if tch else NC, H, K, V), k.device, _store_dtype(k.dtype, "hs_16bit"))
    vn = _empty((k.shape[0], H, V), k.device, _store_dtype(k.dtype, "vn_16bit", no_grad))
    hT = _empty((N, H, K, V), k.device, torch.float32) if want_final else hs
    if fused:
        form, v, beta, Ainv = fused
        vn_tma = _rows_desc(vn, "state_fwd_tma_vn", use_g, "vn_desc", "TMA_VN", ch, BC, BV)
        state_fwd_fused_kernel[(cdiv(V, BV), N * H)](
            k, v, beta, gcum, Ainv, h0 if h0 is not None else hs, hs, vn, hT, ch["start"], ch["length"],
            ch["seq_ptr"], H=H, K=K, V=V, BC=BC, BK=BK, BV=BV, USE_G=use_g, USE_H0=h0 is not None,
            STORE_HT=want_final, FORM=form, DOT=dot,
            **(dict(tseq_ptr=tch["seq_ptr"], HS_EVERY=tch["every"],
                    HS_PRED=bool(TUNE["token_state_pred"])) if tch
               else {} if vn_tma else _state_desc(hs, "state_fwd_tma_hs", use_g, "hs_desc", "TMA_HS",
                                                  K, V, BK, BV)),
            **vn_tma,
            num_warps=nw, num_stages=ns, **_regs("state_fused", use_g))
        return hs, vn, (hT if want_final else None)
    state_fwd_kernel[(cdiv(V, BV), N * H)](
        k, W, U, gcum, h0 if h0 is not None else hs, hs, vn, hT, ch["start"], ch["length"], ch["seq_ptr"],
        H=H, K=K, V=V, BC=BC, BK=BK, BV=BV, USE_G=use_g, USE_H0=h0 is not None,
        STORE_HT=want_final, DOT=dot, num_warps=nw, num_stages=ns)
    return hs, vn, (hT if want_final else None)


class ChunkDeltaProductFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, g, h0, scale, output_final_state, cu_seqlens, chunk_size):
        B, T, H, K = q.shape
        n_h, V = k.shape[2], v.shape[-1]
        BC, BK, BVf, BV, dot = _cfg(q, k, v, chunk_size)
        raw = _raw(k) and q.dtype == k.dtype
        ch = build_chunks(B, T, n_h, BC, cu_seqlens, q.device)
        Ls = B * T * n_h
        qf = q.reshape(B * T, H, K).contiguous()
        kf = k.reshape(Ls, H, K).contiguous()
        vf = v.reshape(Ls, H, V).contiguous()
        bf = beta.reshape(Ls, H).contiguous()
        use_g = g is not None
        gf = g.reshape(B * T, H).contiguous() if use_g else None
        h0c = h0.float().contiguous() if h0 is not None else None
        dev = q.device
        gcum = _empty((Ls, H), dev, torch.float32) if use_g else bf
        own = _autograd_ctx(ctx)
        a16 = own and TUNE["a_16bit"] and k.dtype in (torch.float16, torch.bfloat16)
        Ainv = _empty((ch["NC"], H, BC, BC), dev, torch.float16 if a16 else torch.float32)
        form = _fuse_form() if own else getattr(ctx, "form_request", 0)
        if form:                    # W, U formed in the state kernels, never stored (state_fused.py)
            W = U = None
        else:
            idt = _store_dtype(k.dtype, "inter_16bit")
            W = _empty((Ls, H, K), dev, idt)
            U = _empty((Ls, H, V), dev, idt)
        NC = ch["NC"]
        if NC > 0 and BC == 64 and TUNE["wy_split"]:
            # two kernels: the 16x16 substitutions run with few warps, W/U with more (wy64.py)
            tri_inv64_kernel[(NC, H)](kf, bf, gf if use_g else bf, gcum, Ainv, ch["start"], ch["length"],
                                      H=H, K=K, NH=n_h, BK=BK, USE_G=use_g, DOT=dot, RAW=raw,
                                      BATCHED=bool(TUNE["inv_batched"]),
                                      num_warps=TUNE["inv"][0], num_stages=TUNE["inv"][1], **_regs("inv", use_g))
            if not form:
                wu_fwd_kernel[(NC, H)](kf, vf, bf, gcum, Ainv, W, U, ch["start"], ch["length"], H=H, K=K,
                                       V=V, BC=BC, BK=BK, BV=_bv("wu", BVf), USE_G=use_g, DOT=dot,
                                       num_warps=TUNE["wu"][0], num_stages=TUNE["wu"][1])
        elif NC > 0:
            wy_fwd_kernel[(NC, H)](kf, vf, bf, gf if use_g else bf, gcum, Ainv,
                                   W if W is not None else Ainv, U if U is not None else Ainv,
                                   ch["start"], ch["length"], H=H, K=K, V=V, NH=n_h, BC=BC,
                                   BK=BK, BV=min(BVf, 64), USE_G=use_g, DOT=dot, STORE_WU=not form,
                                   num_warps=TUNE["wy"][0], num_stages=TUNE["wy"][1])
        fused = (form, vf, bf, Ainv) if form else None
        # one state per token chunk (n_h chunks) when nothing needs the per-chunk states later: a
        # forward without gradients (the backward reads every chunk's state)
        tch = None
        no_grad = own and not any(ctx.needs_input_grad)
        if (TUNE["token_chunk_output"] and form and n_h > 1 and NC > 0 and BC == 64
                and TUNE["wy_split"] and no_grad):
            tch = dict(build_token_chunks(ch, n_h, dev), every=n_h)
        hs, vn, hT = _state_fwd(kf, W, U, gcum, h0c, ch, H, K, V, BC, BK, BVf, use_g,
                                output_final_state, dot, fused, tch, no_grad)
        # the token-chunk output over per-chunk states (a forward with gradients)
        tch_out = tch
        if tch is None and TUNE["token_chunk_output_grad"] and n_h > 1 and NC > 0:
            tch_out = build_token_chunks(ch, n_h, dev)
        if output_final_state and NC == 0:
            hT = h0c.clone() if h0c is not None else torch.zeros(ch["N"], H, K, V, device=dev)
        o = _empty((B * T, H, V), dev, q.dtype)
        raw_h = bool(TUNE["output_raw_h"]) and raw and hs.dtype == q.dtype
        if tch_out:
            BVo = _bv("output", BVf)
            output_tok_fwd_kernel[(cdiv(V, BVo), tch_out["NT"], H)](
                qf, kf, gcum, hs, vn, o, tch_out["first"], tch_out["count"], ch["start"], ch["length"],
                scale, H=H, K=K, V=V, NH=n_h, BC=BC, BK=BK, BV=BVo, USE_G=use_g, DOT=dot, RAW=raw,
                RAW_H=raw_h, HS_CHUNK=tch is None,
                num_warps=TUNE["output"][0], num_stages=TUNE["output"][1], **_regs("output_tok", use_g))
        elif NC > 0:
            BVo = _bv("output", BVf)
            output_fwd_kernel[(cdiv(V, BVo), NC, H)](
                qf, kf, gcum, hs, vn, o, ch["start"], ch["length"], scale, H=H, K=K, V=V, NH=n_h,
                BC=BC, BK=BK, BV=BVo, USE_G=use_g, DOT=dot, RAW=raw, RAW_H=raw_h,
                num_warps=TUNE["output"][0], num_stages=TUNE["output"][1])
        keep = own and TUNE["save_states"] and NC > 0 and tch is None
        ctx.save_for_backward(qf, kf, vf, bf, gf, h0c, gcum, Ainv, W, U,
                              hs if keep else None, vn if keep else None)
        ctx.form = form             # the backward follows the forward's choice, whatever TUNE says then
        ctx.meta = (B, T, H, K, V, n_h, BC, BK, BVf, BV, dot, scale, use_g, ch,
                    h0 is not None, q.dtype, k.dtype, v.dtype, beta.dtype,
                    g.dtype if use_g else None, h0.dtype if h0 is not None else None)
        return o.reshape(B, T, H, V), hT

    @staticmethod
    def backward(ctx, do, dhT):
        qf, kf, vf, bf, gf, h0c, gcum, Ainv, W, U, hs, vn = ctx.saved_tensors
        (B, T, H, K, V, n_h, BC, BK, BVf, _, dot, scale, use_g, ch, has_h0,
         qdt, kdt, vdt, bdt, gdt, h0dt) = ctx.meta
        raw = _raw(kf) and qf.dtype == kf.dtype
        dev = qf.device
        Ls = B * T * n_h
        N, NC = ch["N"], ch["NC"]
        do = do.reshape(B * T, H, V).contiguous()
        form = getattr(ctx, "form", 0)   # the forward's choice (lrnn_scan.compile's ctx passes it)
        fused = (form, vf, bf, Ainv) if form else None
        if hs is None:              # recompute (default): the forward did not keep them
            hs, vn, _ = _state_fwd(kf, W, U, gcum, h0c, ch, H, K, V, BC, BK, BVf, use_g, False, dot, fused)
        dhs = _empty((NC, H, K, V), dev, _store_dtype(kf.dtype, "dhs_16bit"))
        dvn = _empty((Ls, H, V), dev, torch.float32)
        dh0 = _empty((N, H, K, V), dev, torch.float32)
        dhTc = dhT.float().contiguous() if dhT is not None else None
        # FORM 2: dvn receives X = A^T dVn and the WY backward needs no dA (TUNE["wy_bwd_vn"])
        atdv = form == 2 and bool(TUNE["wy_bwd_vn"])
        lean = bool(TUNE["state_bwd_lean"]) and form == 2
        local_dv = lean and bool(TUNE["state_bwd_local_dv"])
        if NC > 0:
            BVl, BVs = _bv("dv_local", BVf), _bv("state_bwd_fused" if form else "state_bwd", BVf)
            if not local_dv:
                dv_local_kernel[(cdiv(V, BVl), NC, H)](
                    qf, kf, gcum, do, dvn, ch["start"], ch["length"], scale, H=H, K=K, V=V, NH=n_h,
                    BC=BC, BK=BK, BV=BVl, USE_G=use_g, DOT=dot, RAW=raw,
                    BVL=_dv_local_bvl(BVl),
                    num_warps=TUNE["dv_local"][0], num_stages=TUNE["dv_local"][1])
            if form:
                state_bwd_fused_kernel[(cdiv(V, BVs), N * H)](
                    qf, kf, bf, gcum, Ainv, do, dhTc if dhTc is not None else dh0, dhs, dvn, dh0,
                    ch["start"], ch["length"], ch["seq_ptr"], scale, H=H, K=K, V=V, NH=n_h, BC=BC,
                    BK=BK, BV=BVs, USE_G=use_g, USE_DHT=dhTc is not None, STORE_DH0=True, FORM=form,
                    DOT=dot, LEAN=lean, RELOAD_K=_case_on("state_bwd_reload_k", use_g) and lean,
                    STORE_ATDV=atdv,
                    LOCAL_DV=local_dv, RAW=raw,
                    **_state_desc(dhs, "state_bwd_tma_dh", use_g, "dhs_desc", "TMA_DH", K, V, BK, BVs),
                    **(_rows_desc(dvn, "state_bwd_tma_x", use_g, "x_desc", "TMA_X", ch, BC, BVs)
                       if atdv and lean else {}),
                    num_warps=TUNE["state_bwd_fused"][0],
                    num_stages=TUNE["state_bwd_fused"][1], **_regs("state_bwd_fused", use_g))
            else:
                state_bwd_kernel[(cdiv(V, BVs), N * H)](
                    qf, kf, W, gcum, do, dhTc if dhTc is not None else dh0, dhs, dvn, dh0,
                    ch["start"], ch["length"], ch["seq_ptr"], scale, H=H, K=K, V=V, NH=n_h, BC=BC,
                    BK=BK, BV=BVs, USE_G=use_g, USE_DHT=dhTc is not None, STORE_DH0=True, DOT=dot,
                    num_warps=TUNE["state_bwd"][0], num_stages=TUNE["state_bwd"][1])
        else:
            dh0 = dhTc.clone() if dhTc is not None else torch.zeros_like(dh0)
        # every token has one query row and one first sub-step, every sub-step one chunk:
        # all gradient buffers are fully written by the kernels below
        dq = _empty((B * T, H, K), dev, qdt)
        # fuse: dqkwg_bwd does wy_bwd_vn's work too and writes the final dk (TUNE["dqkwg_fuse_wy"])
        fuse = atdv and bool(TUNE["dqkwg_fuse_wy"])
        dk_part = dq if fuse else _empty((Ls, H, K), dev, torch.float32)   # dq: an unused pointer
        dk = _empty((Ls, H, K), dev, kdt)
        dv = _empty((Ls, H, V), dev, vdt)
        db = _empty((Ls, H), dev, bdt)
        dg = _empty((B * T, H), dev, gdt) if use_g else db
        if NC > 0:
            ks = _ksplit("dqkwg_ksplit", BK)
            # atdv: dqkwg_bwd folds A^T dW into dk and the partial dβ (dbp), dG; no dW buffer
            dW = dk_part if atdv else _empty((Ls, H, K), dev, torch.float32)
            dbp = _empty((ks, Ls, H), dev, torch.float32) if atdv else dk_part
            dGp = _empty((ks, Ls, H), dev, torch.float32) if use_g else dk_part
            adj = ks if TUNE["dqkwg_slices_adjacent"] and ks > 1 else 0
            dqkwg_bwd_kernel[(NC * ks, H) if adj else (NC, H, ks)](
                                          qf, kf, vf, bf, gcum, hs, vn, dvn, dhs, do, dq,
                                          dk if fuse else dk_part, dv, dW, dGp, dbp,
                                          ch["start"], ch["length"], scale, Ls * H, H=H, K=K, V=V,
                                          NH=n_h, BC=BC, BK=BK // ks, BV=_bv("dqkwg", BVf), USE_G=use_g,
                                          DOT=dot, RAW=raw, DG_GRADS=bool(TUNE["dqkwg_dg_grads"]),
                                          RAW_H=bool(TUNE["dqkwg_raw_h"]) and raw and hs.dtype == do.dtype,
                                          KS_ADJ=adj, ATDV=atdv, FUSE_WY=fuse, NKS=ks,
                                          **_rows_desc(dk if fuse else dk_part, "dqkwg_tma_dk", use_g,
                                                       "dk_desc", "TMA_DK", ch, BC, BK // ks),
                                          num_warps=TUNE["dqkwg"][0],
                                          num_stages=TUNE["dqkwg"][1], **_regs("dqkwg", use_g))
            if fuse:
                wy_partials_kernel[(NC, H)](dbp, dGp, db, dg, ch["start"], ch["length"], Ls * H, H=H,
                                            NH=n_h, BC=BC, NP=ks, USE_G=use_g, num_warps=1)
            elif atdv:
                nw, ns, bv = TUNE["wy_bwd_vn_cfg"]
                wy_bwd_vn_kernel[(NC, H)](kf, vf, bf, gcum, vn, dvn, dbp, dGp, dk_part, dk, dv, db, dg,
                                          ch["start"], ch["length"], Ls * H, H=H, K=K, V=V, NH=n_h,
                                          BC=BC, BK=BK, BV=min(BVf, bv), KS=_ksplit("wy_bwd_vn_ksplit", BK),
                                          NP=ks, USE_G=use_g, DOT=dot, RAW=raw, num_warps=nw,
                                          num_stages=ns, **_regs("wy_bwd_vn", use_g))
            else:
                if use_g:
                    dGp = dGp[0] if ks == 1 else dGp.sum(0)   # the K slices' partial dG
                wy_bwd_kernel[(NC, H)](kf, vf, bf, gcum, Ainv, dW, dvn, dGp, dk_part, dk, dv, db, dg,
                                       ch["start"], ch["length"], H=H, K=K, V=V, NH=n_h, BC=BC, BK=BK,
                                       BV=_bv("wy_bwd", BVf), USE_G=use_g, DOT=dot, RAW=raw,
                                       KS=_ksplit("wy_bwd_ksplit", BK), EARLY=bool(TUNE["wy_bwd_early_db"]),
                                       num_warps=TUNE["wy_bwd"][0], num_stages=TUNE["wy_bwd"][1],
                                       **_regs("wy_bwd", use_g))
        else:
            for x in (dq, dk, dv, db, dg):
                x.zero_()
        return (dq.reshape(B, T, H, K), dk.reshape(B, T, n_h, H, K),
                dv.reshape(B, T, n_h, H, V), db.reshape(B, T, n_h, H),
                dg.reshape(B, T, H) if use_g else None,
                dh0.to(h0dt) if has_h0 else None, None, None, None, None)


def chunk_delta_product_triton(q, k, v, beta, g=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, chunk_size=64):
    """Triton path (inputs validated by :func:`lrnn_scan.delta.chunk_delta_product`).

    float16/bfloat16/float32 inputs; the triangular solve, states and pseudo-values are float32.
    """
    if q.dtype == torch.float64:
        raise TypeError("the Triton backend does not take float64 inputs; use backend='torch'")
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    o, hT = ChunkDeltaProductFunction.apply(q, k, v, beta, g, initial_state, scale,
                                            bool(output_final_state), cu_seqlens, int(chunk_size))
    return o, hT
