"""Single-pass decoupled look-back backward for the diagonal scan (m = 1): the default where the
gradient rule would time-chunk or the one-pass backward has few programs (``scan.TUNE
["bwd_lookback"]``: "auto", True, False; see ``scan._diag_bwd_lookback``). CPU-interpreter tests
and an H100 many-tile race test pass; H100 B1 T16384 N768 fwd+bwd 0.239 ms (CUDA graph) against
0.280 with the chunked backward (2026-11-25), 0.167 ms with 4 warps and 4-chunk windows
(2026-11-26).

The adjoint of ``h_t = a_t h_{t-1} + b_t`` runs backwards in time:
``lam_t = dh_t + a_{t+1} lam_{t+1}`` (``lam_{eos-1} = dh_{eos-1} + dh_final``), then
``db_t = lam_t``, ``da_t = lam_t h_{t-1}`` (``h_{bos-1} = h0``), ``dh0 = a_bos lam_bos``. The
chunked backward of ``scan._diag_backward`` needs three launches and the forward's chunk products;
this is one launch whatever the number of sequences, reading ``a``, ``h``, ``dh`` once.

It reuses the forward look-back's protocol (``lookback.py``: dynamic tile ids, status flags,
``_look_back``, ``_publish``) on *reversed* chunk indices: ``cr = ncs - 1 - c`` with ``ncs`` the
sequence's number of chunks, so ``cr = 0`` is a sequence's last chunk, which knows its carry
(``dh_final``) at once, and a tile only waits on tiles of smaller ``cr``, handed out before it.
The carry between chunks is ``mu = a_{t0} lam_{t0}`` (what chunk ``c - 1`` adds to its last
``dh``); chunk ``c`` maps its incoming ``mu`` to its outgoing one by ``mu_out = P mu_in + E`` with
``(P, E) = a_{t0} (prod, sum)`` from one ``tl.associative_scan`` over the tile, rows in reverse
time (row ``r`` is time ``t1 - 1 - r``; its coefficient is ``a_{t+1}``, 1 on row 0, where the
carry already holds ``a_{t1}``). Chunk 0's outgoing ``mu`` is ``dh0``; an empty sequence has one
tile (``cr = 0``) that writes ``dh0 = dh_final``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, diag_vec, max_seq_len, row_divisor
from .fwd import _affine_combine, _seq_bounds
from .lookback import _last_row, _look_back, _next_tile, _publish, lookback_cfg

__all__ = ["diag_lookback_backward"]


@triton.jit
def _reversed_chunk(CU, s, cr, T, CHUNK: tl.constexpr, VARLEN: tl.constexpr):
    """Chunk ``cr`` of sequence ``s`` counted from its end: ``(bos, eos, c, t0, t1)`` with ``c`` its
    index from the start, negative for tiles past a shorter sequence's chunks (varlen), and
    ``[t0, t1)`` its steps."""
    bos, eos, _, _ = _seq_bounds(CU, s, s * 0, T, CHUNK, VARLEN)  # chunk 0: only bos, eos
    ncs = (eos - bos + CHUNK - 1) // CHUNK  # this sequence's chunks (0 if empty)
    c = ncs - 1 - cr
    t0 = bos + c * CHUNK
    t1 = tl.minimum(t0 + CHUNK, eos)
    return bos, eos, c, t0, t1


@triton.jit(do_not_specialize=["T", "NC", "NSEQ"])
def _diag_lookback_bwd(Aa, Hs, H0, G, DHT, DA, DB, DH0, Status, Vals, CU, T, N, NC, NSEQ,
                       CHUNK: tl.constexpr, BN: tl.constexpr, W: tl.constexpr,
                       HAS_H0: tl.constexpr, HAS_DHT: tl.constexpr, VARLEN: tl.constexpr,
                       NV: tl.constexpr = 1, VEC: tl.constexpr = 0):
    """a, h, dh, da, db ``(B*T, N)`` rows (``B == 1`` with ``CU``); ``H0``, ``DHT``, ``DH0``
    ``(nseq, N)``; ``Status`` int32 ``(ntile + 1,)`` zeroed; ``Vals`` fp32 ``(3, ntile, BN)``.
    ``NV``: a power of two dividing ``N`` (``_host.row_divisor``); ``VEC``: ``_host.diag_vec``."""
    N = (N // NV) * NV  # proven NV-aligned: at N776 the loads were scalar and spilled (ptxas)
    GN = tl.cdiv(N, BN)
    cr, s, pn, ntile = _next_tile(Status, NSEQ, GN, NC)  # cr: reversed chunk index (later: smaller)
    bos, eos, c, t0, t1 = _reversed_chunk(CU, s, cr, T, CHUNK, VARLEN)
    real = c >= 0
    bn = tl.arange(0, BN)
    n = pn * BN + bn
    if VEC > 0:
        n = tl.max_contiguous(n, VEC)  # see fwd._diag_fwd_kernel
    mn = n < N
    r = tl.arange(0, CHUNK)
    t = t1 - 1 - r
    m2 = ((t >= t0) & ((c + 0 * r) >= 0))[:, None] & mn[None, :]
    offs = t[:, None] * N + n[None, :]
    coef = tl.load(Aa + offs + N, mask=m2 & (r > 0)[:, None], other=1.0).to(tl.float32)
    gv = tl.load(G + offs, mask=m2, other=0.0).to(tl.float32)
    cc, cv = tl.associative_scan((coef, gv), 0, _affine_combine)  # lam_t = cc mu_in + cv
    a0 = tl.load(Aa + t0 * N + n, mask=mn & ((c + 0 * n) >= 0), other=1.0).to(tl.float32)
    pa = a0 * _last_row(cc, CHUNK)  # padded rows are identity: the last row is time t0
    pb = a0 * _last_row(cv, CHUNK)
    base = (s.to(tl.int64) * GN + pn) * NC
    me = base + cr
    VA = Vals
    VB = Vals + ntile.to(tl.int64) * BN
    VI = Vals + 2 * ntile.to(tl.int64) * BN
    carry = tl.zeros([BN], dtype=tl.float32)
    if cr == 0:  # a sequence's last chunk: its carry is dh_final
        if HAS_DHT:
            carry = tl.load(DHT + s.to(tl.int64) * N + n, mask=mn, other=0.0).to(tl.float32)
    elif real:
        tl.store(VA + me * BN + bn, pa)  # before _publish's barrier and flag
        _publish(Status, me, VB + me * BN + bn, pb, 1)
        carry = _look_back(Status, VA, VB, VI, base, cr, bn, BN, W)
    if real | (cr == 0):  # tiles past a shorter sequence's chunks (varlen) do nothing
        mu_out = pa * carry + pb
        if real:  # before the tile's stores: the flag's release fence would wait for them
            _publish(Status, me, VI + me * BN + bn, mu_out, 2)
        lam = cc * carry[None, :] + cv
        tl.store(DB + offs, lam.to(DB.dtype.element_ty), mask=m2)
        hp = tl.load(Hs + offs - N, mask=m2 & (t > bos)[:, None], other=0.0).to(tl.float32)
        if HAS_H0:
            h0 = tl.load(H0 + s.to(tl.int64) * N + n, mask=mn, other=0.0).to(tl.float32)
            hp = tl.where((t == bos)[:, None], h0[None, :], hp)
        tl.store(DA + offs, (lam * hp).to(DA.dtype.element_ty), mask=m2)
        if c <= 0:  # chunk 0, or the one tile of an empty sequence
            tl.store(DH0 + s.to(tl.int64) * N + n, mu_out, mask=mn)


def diag_lookback_backward(a, h, h0, g, dhT, cu, tune, empty, max_len=None):
    """``scan._diag_backward``'s contract in one launch: ``(da, db, dh0)`` for ``a``, ``h``
    ``(B, T, N)``, ``h0`` ``(nseq, N)`` or None, ``g = dL/dh`` ``(B, T, N)``, ``dhT = dL/dh_final``
    ``(nseq, N)`` fp32 or None, ``cu`` int64 offsets or None. Tiles from ``lookback_cfg(tune, True)``;
    ``empty`` allocates the outputs (the launcher's NaN-poisoning ``_empty``)."""
    B, T, N = h.shape
    nseq = B if cu is None else cu.numel() - 1
    ch, bn, w, nw = lookback_cfg(tune, True)
    dev = h.device
    max_len = max_seq_len(T, cu, max_len)
    nc = max(1, cdiv(max_len, ch))  # >= 1: an empty sequence still writes dh0
    gn = cdiv(N, bn)
    ntile = nseq * gn * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)
    vals = empty((3, ntile, bn), torch.float32, dev)
    da = empty(a.shape, a.dtype, dev)
    db = empty(h.shape, h.dtype, dev)
    dh0 = empty((nseq, N), torch.float32, dev)
    if ntile:
        _diag_lookback_bwd[(ntile,)](
            a, h, h0 if h0 is not None else h, g, dhT if dhT is not None else h, da, db, dh0,
            status, vals, cu if cu is not None else h, T, N, nc, nseq, CHUNK=ch, BN=bn, W=w,
            HAS_H0=h0 is not None, HAS_DHT=dhT is not None, VARLEN=cu is not None,
            NV=row_divisor(N), VEC=diag_vec(h.element_size(), tune, True), num_warps=nw)
    return da, db, dh0
