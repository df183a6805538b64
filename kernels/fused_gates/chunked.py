"""Time-chunked fused-gate scan: for a few long sequences, where one program per sequence and head
group leaves most of the GPU idle and the recurrence's chain sets the time.

Forward (``A_t`` from the logits in registers in every pass, never written):

1. ``chunk_summary_kernel``: per chunk ``c`` of ``CHUNK`` steps, the product of its transitions
   ``P_c = A_last … A_first`` and its end state from zero ``E_c``: ``S <- A_t S`` on the columns
   of ``[P | ·]`` a program owns (``NCB`` of them; ``S`` starts as those columns of ``I``) and
   ``e <- A_t e + a0_t ⊙ v_t``.
2. The carries: ``X_c = P_c X_{c-1} + E_c`` (``X_{-1} = h0``), the same kernel as the unchunked
   scan over a materialised ``A`` (``COL0 = 0``) with chunks as time steps. ``X_last`` is the
   final state.
3. Each chunk again from ``X_{c-1}`` (``block_scan_fwd_kernel`` with ``CHUNKED``), writing ``h``.

Backward, with ``μ_c`` the adjoint entering chunk ``c``'s last step from the right:

1. ``F_c``: the carry out of chunk ``c`` from ``μ = 0`` (``block_scan_bwd_kernel``, carries only).
2. The carry out of chunk ``c`` is ``P_c^T μ_c + F_c = μ_{c-1}``, ``μ_last = ∂L/∂h_final``: a scan
   over the reversed chunks with transitions ``P_c^T`` (the forward's ``P``); its final is ``∂L/∂h0``.
3. Each chunk again from ``μ_c`` with the fused gate gradients (``h_{t-1}`` read from ``h``, and
   ``h0`` at a sequence's first step only).

Past a varlen sequence's end its chunks are empty: ``P = I``, ``E = 0``, ``F = 0``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, next_pow2
from .gate_math import gate_normalize
from .kernels import _chunk_bounds, _seq_bounds, _tiles

__all__ = ["chunk_summary_kernel", "chunked_forward", "chunked_backward", "summary_config"]


@triton.jit
def _summary_step(Z, V, tok, S, e, off_z, mask3, off_z0, off_v, mask2, sz, sv, eps,
                  AX: tl.constexpr, VARIANT: tl.constexpr):
    """``S <- A_t S``, ``e <- A_t e + a0_t ⊙ v_t`` on a tile reduced over AX (as ``_fwd_step``)."""
    z = tl.load(Z + tok * sz + off_z, mask=mask3, other=0.0).to(tl.float32)
    z0 = tl.load(Z + tok * sz + off_z0, mask=mask2, other=0.0).to(tl.float32)
    v = tl.load(V + tok * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    w, w0, _g, _g0, _s, _s0 = gate_normalize(z, z0, mask3, eps, AX, VARIANT)
    e = tl.sum(w * tl.expand_dims(e, 3 - AX), axis=AX) + w0 * v
    S = tl.sum(tl.expand_dims(w, 3) * tl.expand_dims(S, 3 - AX), axis=AX)
    return S, e


@triton.jit
def _summary_step_dot(Z, V, tok, S, e, off_z, mask3, off_z0, off_v, mask2, sz, sv, eps,
                      MP: tl.constexpr, VARIANT: tl.constexpr, PREC: tl.constexpr):
    """As ``_summary_step`` on the N tile of one block (``BH = NCB / MP = 1``), ``S <- A_t S`` by
    ``tl.dot`` (tensor cores with ``PREC="tf32x3"``): the broadcast product's cross-warp
    reduction each step made m = 16 / 32 summaries slower than the unfused path."""
    z = tl.load(Z + tok * sz + off_z, mask=mask3, other=0.0).to(tl.float32)
    z0 = tl.load(Z + tok * sz + off_z0, mask=mask2, other=0.0).to(tl.float32)
    v = tl.load(V + tok * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    w, w0, _g, _g0, _s, _s0 = gate_normalize(z, z0, mask3, eps, 2, VARIANT)
    e = tl.sum(w * tl.expand_dims(e, 1), axis=2) + w0 * v
    S = tl.reshape(tl.dot(tl.reshape(w, (MP, MP)), tl.reshape(S, (MP, MP)), input_precision=PREC),
                   (1, MP, MP))
    return S, e


@triton.jit(do_not_specialize=["T"])
def chunk_summary_kernel(Z, V, P, PT, E, CU, T, H, CHUNK, eps,
                         M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, NCB: tl.constexpr,
                         VARIANT: tl.constexpr, NS: tl.constexpr, IS_VARLEN: tl.constexpr,
                         DOT: tl.constexpr = False, PREC: tl.constexpr = "ieee"):
    """Grid ``(num_seqs, head groups x MP // NCB, chunks)``: ``P (num_seqs, chunks, H, m, m)``
    columns ``[g*NCB, (g+1)*NCB)``, the same entries of ``PT`` (``P^T`` with the chunks in
    reverse: the backward's carry scan) and, for column group 0, ``E (num_seqs, chunks, H, m)``."""
    NGRP: tl.constexpr = MP // NCB
    i_n = tl.program_id(0)
    i_h = tl.program_id(1) // NGRP
    i_g = tl.program_id(1) % NGRP
    i_c = tl.program_id(2)
    bos, L = _seq_bounds(CU, i_n, T, IS_VARLEN)
    bos, L = _chunk_bounds(bos, L, i_c, CHUNK)
    off_v, off_z0, mask2, off_n, mask_n, off_t, mask_t = _tiles(i_h, H, M, MP, BH, 1)
    sz = H * (M * (M + 1))
    sv = H * M
    o_j = tl.arange(0, MP)
    o_c = i_g * NCB + tl.arange(0, NCB)
    eye = (o_j[:, None] == o_c[None, :]).to(tl.float32)
    S = tl.zeros([BH, MP, NCB], dtype=tl.float32) + eye[None, :, :]
    e = tl.zeros([BH, MP], dtype=tl.float32)
    if DOT:  # one block a program, all columns (BH = 1, NCB = MP >= 16)
        for t in tl.range(0, L, num_stages=NS):
            S, e = _summary_step_dot(Z, V, bos + t, S, e, off_n, mask_n, off_z0, off_v, mask2, sz,
                                     sv, eps, MP, VARIANT, PREC)
    else:
        for p in tl.range(0, L // 2, num_stages=NS):
            tok = bos + 2 * p
            S, e = _summary_step(Z, V, tok, S, e, off_n, mask_n, off_z0, off_v, mask2, sz, sv, eps,
                                 2, VARIANT)
            S, e = _summary_step(Z, V, tok + 1, S, e, off_t, mask_t, off_z0, off_v, mask2, sz, sv,
                                 eps, 1, VARIANT)
        if L % 2 == 1:
            S, e = _summary_step(Z, V, bos + L - 1, S, e, off_n, mask_n, off_z0, off_v, mask2, sz,
                                 sv, eps, 2, VARIANT)
    k = i_n.to(tl.int64) * tl.num_programs(2) + i_c  # (sequence, chunk) entry
    k_rev = k + tl.num_programs(2) - 1 - 2 * i_c      # (sequence, chunks - 1 - chunk)
    col = o_c[None, None, :]
    o_i = tl.arange(0, MP)[None, :, None]
    mask = mask2[:, :, None] & (col < M)
    tl.store(P + k * (sv * M) + off_v[:, :, None] * M + col, S, mask=mask)
    tl.store(PT + k_rev * (sv * M) + (off_v[:, :, None] - o_i) * M + col * M + o_i, S, mask=mask)
    if i_g == 0:
        tl.store(E + k * sv + off_v, e, mask=mask2)


def summary_config(H: int, m: int, tune: dict) -> tuple[int, int, int, str | None]:
    """(BH blocks a program, NCB columns of ``P`` a program, num_warps, ``tl.dot`` precision or
    None) of the summary kernel. m <= 8: broadcast products, ``BH x MP x MP x NCB`` a step, about
    512 a program (NCB = MP up to 8). m = 9..32 (``sum_dot``, default on): one block a program,
    ``S <- A_t S`` by ``tl.dot`` (``sum_prec``: ``"tf32x3"`` at MP 16, ``"ieee"`` at 32, as
    ``block_diagonal/summary.py`` measured; 1 warp at MP 16, 4 at 32). ``tune`` keys ``sum_bh``,
    ``sum_ncb``, ``sum_warps`` override."""
    mp = max(2, next_pow2(m))
    if mp >= 16 and tune.get("sum_dot", True):
        prec = tune.get("sum_prec", "tf32x3" if mp == 16 else "ieee")
        if prec not in ("tf32x3", "ieee"):
            raise ValueError(f"TUNE['sum_prec'] must be 'tf32x3' or 'ieee', got {prec!r}")
        return 1, mp, tune.get("sum_warps", 1 if mp == 16 else 4), prec
    ncb = tune.get("sum_ncb", min(mp, 8))
    if ncb not in (1, 2, 4, 8, 16, 32) or ncb > mp:
        raise ValueError(f"TUNE['sum_ncb'] must be a power of two <= {mp}, got {ncb!r}")
    bh = tune.get("sum_bh", max(1, min(next_pow2(H), 512 // (mp * mp * ncb))))
    elems = bh * mp * mp * ncb
    warps = tune.get("sum_warps", 1 if elems <= 256 else 2 if elems <= 1024 else 4 if elems <= 4096 else 8)
    return bh, ncb, warps, None


def _summaries(z, v, cu, T, H, m, code, eps, chunk, nc, nseq, stages, tune, empty):
    mp = max(2, next_pow2(m))
    bh, ncb, warps, prec = summary_config(H, m, tune)
    P = empty((nseq, nc, H, m, m), torch.float32, v.device)
    PT = empty((nseq, nc, H, m, m), torch.float32, v.device)
    E = empty((nseq, nc, H, m), torch.float32, v.device)
    chunk_summary_kernel[(nseq, cdiv(H, bh) * (mp // ncb), nc)](
        z, v, P, PT, E, cu if cu is not None else v, T, H, chunk, eps, M=m, MP=mp, BH=bh, NCB=ncb,
        VARIANT=code, NS=stages, IS_VARLEN=cu is not None, DOT=prec is not None,
        PREC=prec or "ieee", num_warps=warps, num_stages=stages)
    return P, PT, E


def chunked_forward(launch_fwd, config, fwd_kernel, z, v, h0, cu, T, H, m, code, eps, chunk, nc,
                    out_fp32_final, out_dtype, tune, empty):
    """``(h, h_final | None, PT)``: the three passes of the module docstring (``PT``: the chunk
    products transposed, chunks reversed, for ``chunked_backward``). ``launch_fwd`` is
    ``function._launch_fwd`` (the carries' scan), ``config`` ``function._config``; ``z``, ``v``
    as the kernels read them (``as_loaded``), ``h0`` fp32 or None."""
    nseq = cu.numel() - 1 if cu is not None else v.shape[0]
    P, PT, E = _summaries(z, v, cu, T, H, m, code, eps, chunk, nc, nseq, config(nseq * nc, H, m, v.device)[2],
                      tune, empty)
    X, hf = launch_fwd(P, E, h0, None, nc, H, m, 0, 5, 1.0, out_fp32_final, torch.float32)
    h = empty(v.shape, out_dtype, v.device)
    bh, warps, stages = config(nseq * nc, H, m, v.device)
    fwd_kernel[(nseq, cdiv(H, bh), nc)](
        z, v, h0 if h0 is not None else X, h, X, cu if cu is not None else X, X, T, H, chunk, eps,
        M=m, MP=max(2, next_pow2(m)), BH=bh, COL0=1, VARIANT=code, NS=stages, HAS_H0=h0 is not None,
        STORE_HF=False, IS_VARLEN=cu is not None, CHUNKED=True, num_warps=warps, num_stages=stages)
    return h, hf, PT


def chunked_backward(launch_fwd, config, bwd_kernel, z, v, h0, h, dh, dhf, PT, cu, T, H, m, code,
                     eps, chunk, need_dh0, dz, dv, empty):
    """``dh0 | None``, writing ``dz``, ``dv``: the three backward passes of the module docstring.
    Inputs as ``function._launch_bwd`` passes them to the kernel; ``PT`` from ``chunked_forward``."""
    nseq, nc = PT.shape[0], PT.shape[1]
    bh, warps, stages = config(nseq * nc, H, m, v.device, bwd=True)
    grid = (nseq, cdiv(H, bh), nc)
    cu_arg = cu if cu is not None else dh
    kw = dict(M=m, MP=max(2, next_pow2(m)), BH=bh, COL0=1, VARIANT=code, NS=stages,
              HAS_H0=h0 is not None, IS_VARLEN=cu is not None, CHUNKED=True, num_warps=warps,
              num_stages=stages)
    F = empty((nseq, nc, H, m), torch.float32, v.device)  # chunks reversed, as PT
    bwd_kernel[grid](z, v, h0 if h0 is not None else h, h, dh, dh, dz, dv, F, cu_arg, F, T, H,
                     chunk, eps, HAS_DHF=False, STORE_DH0=True, HAS_XIN=False, STORE_GRADS=False, **kw)
    # carries over the reversed chunks: μ_{c-1} = P_c^T μ_c + F_c
    X, dh0 = launch_fwd(PT, F, dhf, None, nc, H, m, 0, 5, 1.0, need_dh0, torch.float32)
    bwd_kernel[grid](z, v, h0 if h0 is not None else h, h, dh, dhf if dhf is not None else dh, dz,
                     dv, dv, cu_arg, X, T, H, chunk, eps, HAS_DHF=dhf is not None, STORE_DH0=False,
                     HAS_XIN=True, STORE_GRADS=True, **kw)
    return dh0
