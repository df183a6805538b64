"""Triton kernels: block-diagonal recurrence with gates normalised in registers.

One program owns ``BH`` blocks of one sequence and walks time sequentially, the ``m``-vector
state of each block in registers (fp32). Per step it reads the ``m x (m+1)`` logits of each block
(or, with ``HAS_GATE=False``, a materialised ``m x m`` block ``A`` and ``b``), never writes ``A``.

Layouts (contiguous): logits ``(tokens, H, m, K1)`` with ``K1 = m + COL0`` (``COL0 = 1``: column 0 is
the input gate), ``v``/``h`` ``(tokens, H, m)``, states ``(num_seqs, H, m)``. ``tokens = B*T``;
sequence ``n`` covers tokens ``[bos, eos)`` (``bos = n*T`` or ``cu_seqlens[n]``). All token
offsets are int64.

No layout shuffle on the recurrence chain: steps alternate between the tile ``(b, i, j)``
("N", reduce over ``j`` = axis 2) and its transpose ``(b, j, i)`` ("T", reduce over axis 1,
loaded with transposed offsets). The state that N produces (indexed along axis 1) is exactly
the broadcast operand T needs and vice versa, so the loop runs pairs N, T; an odd leftover
step runs outside the loop. The gate normalisation of both steps of a pair does not depend on
the state and overlaps with the chain.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .gate_math import gate_normalize


@triton.jit
def _seq_bounds(CU, i_n, T, IS_VARLEN: tl.constexpr):
    if IS_VARLEN:
        bos = tl.load(CU + i_n).to(tl.int64)
        eos = tl.load(CU + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    return bos, (eos - bos).to(tl.int32)


@triton.jit
def _chunk_bounds(bos, L, i_c, CHUNK):
    """Chunk ``i_c`` (``CHUNK`` steps) of a sequence ``[bos, bos + L)``: its start and length
    (0 past the sequence's end: a varlen batch sizes its chunk grid by its longest sequence)."""
    start = i_c.to(tl.int64) * CHUNK
    return bos + start, tl.minimum(tl.maximum(L - start, 0), CHUNK).to(tl.int32)


@triton.jit
def _tiles(i_h, H, M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, COL0: tl.constexpr):
    """Offsets / masks: N tile (b, i, j), T tile (b, j, i), input gate and vectors (b, i)."""
    K1: tl.constexpr = M + COL0
    o_b = i_h * BH + tl.arange(0, BH)
    o_i = tl.arange(0, MP)
    m_i = o_i < M
    mask2 = (o_b < H)[:, None] & m_i[None, :]
    row = o_b[:, None] * M + o_i[None, :]
    off_n = row[:, :, None] * K1 + o_i[None, None, :] + COL0
    off_t = row[:, None, :] * K1 + o_i[None, :, None] + COL0
    mask_n = mask2[:, :, None] & m_i[None, None, :]
    mask_t = mask2[:, None, :] & m_i[None, :, None]
    return row, row * K1, mask2, off_n, mask_n, off_t, mask_t


@triton.jit
def _fwd_step(Z, V, HOUT, tok, h, off_z, mask3, off_z0, off_v, mask2, sz, sv, eps,
              AX: tl.constexpr, COL0: tl.constexpr, VARIANT: tl.constexpr):
    """One step on a tile reduced over axis AX (2: N tile, 1: T tile); returns h_t."""
    z = tl.load(Z + tok * sz + off_z, mask=mask3, other=0.0).to(tl.float32)
    v = tl.load(V + tok * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    if COL0 == 1:
        z0 = tl.load(Z + tok * sz + off_z0, mask=mask2, other=0.0).to(tl.float32)
        w, w0, _g, _g0, _s, _s0 = gate_normalize(z, z0, mask3, eps, AX, VARIANT)
        b = w0 * v
    else:
        w = z
        b = v
    h = tl.sum(w * tl.expand_dims(h, 3 - AX), axis=AX) + b
    tl.store(HOUT + tok * sv + off_v, h.to(HOUT.dtype.element_ty), mask=mask2)
    return h


@triton.jit(do_not_specialize=["T"])
def block_scan_fwd_kernel(Z, V, H0, HOUT, HF, CU, XIN, T, H, CHUNK, eps,
                          M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr,
                          COL0: tl.constexpr, VARIANT: tl.constexpr, NS: tl.constexpr,
                          HAS_H0: tl.constexpr, STORE_HF: tl.constexpr, IS_VARLEN: tl.constexpr,
                          CHUNKED: tl.constexpr):
    """Grid ``(num_seqs, head groups)``, or with ``CHUNKED`` ``(num_seqs, head groups, chunks)``:
    chunk ``c > 0`` of ``CHUNK`` steps starts from the carry ``XIN (num_seqs, chunks, H, m)``
    entry ``c - 1`` (the state after chunk ``c - 1``; ``chunked.py``), chunk 0 from ``H0``."""
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    bos, L = _seq_bounds(CU, i_n, T, IS_VARLEN)
    off_v, off_z0, mask2, off_n, mask_n, off_t, mask_t = _tiles(i_h, H, M, MP, BH, COL0)
    sz = H * (M * (M + COL0))
    sv = H * M
    n64 = i_n.to(tl.int64)
    h = tl.zeros([BH, MP], dtype=tl.float32)
    if HAS_H0:
        h = tl.load(H0 + n64 * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    if CHUNKED:
        i_c = tl.program_id(2)
        bos, L = _chunk_bounds(bos, L, i_c, CHUNK)
        if i_c > 0:
            h = tl.load(XIN + (n64 * tl.num_programs(2) + i_c - 1) * sv + off_v, mask=mask2, other=0.0)
    for p in tl.range(0, L // 2, num_stages=NS):
        tok = bos + 2 * p
        h = _fwd_step(Z, V, HOUT, tok, h, off_n, mask_n, off_z0, off_v, mask2, sz, sv, eps,
                      2, COL0, VARIANT)
        h = _fwd_step(Z, V, HOUT, tok + 1, h, off_t, mask_t, off_z0, off_v, mask2, sz, sv, eps,
                      1, COL0, VARIANT)
    if L % 2 == 1:
        h = _fwd_step(Z, V, HOUT, bos + L - 1, h, off_n, mask_n, off_z0, off_v, mask2, sz, sv,
                      eps, 2, COL0, VARIANT)
    if STORE_HF:
        tl.store(HF + n64 * sv + off_v, h, mask=mask2)


@triton.jit
def _bwd_step(Z, V, HOUT, DH, DZ, DV, tok, bos, h0, c, off_z, mask3, off_z0, off_v, mask2, sz, sv,
              eps, AX: tl.constexpr, COL0: tl.constexpr, VARIANT: tl.constexpr,
              STORE: tl.constexpr = True):
    """One adjoint step on a tile reduced over AX; returns A_t^T λ_t (the next step's carry).
    ``bos``: the sequence's first token (``h_{t-1}`` is ``h0`` there); ``STORE=False``: the
    carry alone (a chunk's local adjoint, ``chunked.py``), no gradients read or written."""
    OX: tl.constexpr = 3 - AX
    z = tl.load(Z + tok * sz + off_z, mask=mask3, other=0.0).to(tl.float32)
    g = tl.load(DH + tok * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    lam = g + c
    if not STORE:
        w = z
        if COL0 == 1:
            z0 = tl.load(Z + tok * sz + off_z0, mask=mask2, other=0.0).to(tl.float32)
            w, _w0, _g, _g0, _s, _s0 = gate_normalize(z, z0, mask3, eps, AX, VARIANT)
        return tl.sum(w * tl.expand_dims(lam, AX), axis=OX)
    v = tl.load(V + tok * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    hp = tl.load(HOUT + tl.maximum(tok - 1, bos) * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    hp = tl.where(tok > bos, hp, h0)
    if COL0 == 1:
        z0 = tl.load(Z + tok * sz + off_z0, mask=mask2, other=0.0).to(tl.float32)
        w, w0, gg, gg0, s, s0 = gate_normalize(z, z0, mask3, eps, AX, VARIANT)
        y = tl.sum(w * tl.expand_dims(hp, OX), axis=AX) + w0 * v
        dz = tl.expand_dims(lam, AX) * gg * (tl.expand_dims(hp, OX) - s * tl.expand_dims(y, AX))
        dz0 = lam * gg0 * (v - s0 * y)
        tl.store(DZ + tok * sz + off_z0, dz0.to(DZ.dtype.element_ty), mask=mask2)
        tl.store(DV + tok * sv + off_v, (lam * w0).to(DV.dtype.element_ty), mask=mask2)
    else:
        w = z
        dz = tl.expand_dims(lam, AX) * tl.expand_dims(hp, OX)
        tl.store(DV + tok * sv + off_v, lam.to(DV.dtype.element_ty), mask=mask2)
    tl.store(DZ + tok * sz + off_z, dz.to(DZ.dtype.element_ty), mask=mask3)
    return tl.sum(w * tl.expand_dims(lam, AX), axis=OX)


@triton.jit(do_not_specialize=["T"])
def block_scan_bwd_kernel(Z, V, H0, HOUT, DH, DHF, DZ, DV, DH0, CU, XIN, T, H, CHUNK, eps,
                          M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr,
                          COL0: tl.constexpr, VARIANT: tl.constexpr, NS: tl.constexpr,
                          HAS_H0: tl.constexpr, HAS_DHF: tl.constexpr, STORE_DH0: tl.constexpr,
                          IS_VARLEN: tl.constexpr, CHUNKED: tl.constexpr = False,
                          HAS_XIN: tl.constexpr = False, STORE_GRADS: tl.constexpr = True):
    """Adjoint scan λ_t = g_t + A_{t+1}^T λ_{t+1}, with the fused gate gradient per step.

    Needs h_{t-1}: read from the saved output (or h0 at the sequence start), h_t is recomputed.
    Steps run t = L-1 … 0: an odd leftover first (T tile), then pairs (N at t, T at t-1).
    ``CHUNKED`` (grid ``(num_seqs, head groups, chunks)``): chunk ``c`` of ``CHUNK`` steps; its
    carry in is ``DHF`` for the last chunk and, with ``HAS_XIN``, entry ``chunks - 2 - c`` of
    ``XIN`` (the reversed carry scan of ``chunked.py``) for the others, zero without;
    ``DH0`` entry ``(n, chunks - 1 - c)`` gets the carry out. ``STORE_GRADS=False``: carries only.
    """
    i_n = tl.program_id(0)
    i_h = tl.program_id(1)
    bos, L = _seq_bounds(CU, i_n, T, IS_VARLEN)
    sbos = bos
    off_v, off_z0, mask2, off_n, mask_n, off_t, mask_t = _tiles(i_h, H, M, MP, BH, COL0)
    sz = H * (M * (M + COL0))
    sv = H * M
    n64 = i_n.to(tl.int64)
    h0 = tl.zeros([BH, MP], dtype=tl.float32)
    if HAS_H0:
        h0 = tl.load(H0 + n64 * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    c = tl.zeros([BH, MP], dtype=tl.float32)  # A_{t+1}^T λ_{t+1}
    if HAS_DHF:
        c = tl.load(DHF + n64 * sv + off_v, mask=mask2, other=0.0).to(tl.float32)
    i_c = 0
    nch = 1
    if CHUNKED:
        i_c = tl.program_id(2)
        nch = tl.num_programs(2)
        bos, L = _chunk_bounds(bos, L, i_c, CHUNK)
        if i_c < nch - 1:
            c = tl.zeros([BH, MP], dtype=tl.float32)
            if HAS_XIN:
                c = tl.load(XIN + (n64 * nch + nch - 2 - i_c) * sv + off_v, mask=mask2, other=0.0)
    if L % 2 == 1:
        c = _bwd_step(Z, V, HOUT, DH, DZ, DV, bos + L - 1, sbos, h0, c, off_t, mask_t, off_z0,
                      off_v, mask2, sz, sv, eps, 1, COL0, VARIANT, STORE_GRADS)
    top = bos + (L - L % 2) - 1
    for p in tl.range(0, L // 2, num_stages=NS):
        tok = top - 2 * p
        c = _bwd_step(Z, V, HOUT, DH, DZ, DV, tok, sbos, h0, c, off_n, mask_n, off_z0, off_v,
                      mask2, sz, sv, eps, 2, COL0, VARIANT, STORE_GRADS)
        c = _bwd_step(Z, V, HOUT, DH, DZ, DV, tok - 1, sbos, h0, c, off_t, mask_t, off_z0, off_v,
                      mask2, sz, sv, eps, 1, COL0, VARIANT, STORE_GRADS)
    if STORE_DH0:  # chunked: entry (n, chunks - 1 - c), the order of the reversed carry scan
        tl.store(DH0 + (n64 * nch + nch - 1 - i_c) * sv + off_v, c, mask=mask2)
