"""Single-pass decoupled look-back forward for the block-diagonal scan (m = 2..8), opt-in, untimed.

``TUNE["fwd_lookback"] = True`` routes ``block_diagonal_scan``'s forward here for ``2 <= m <= 8``
(``m`` not a power of two: padded to ``MP``, like the other block kernels; ``m > 8`` keeps the
default forward). The protocol (tile counter, flags, ``_publish``) is ``lookback.py``'s; what
differs is that a chunk's map ``x -> P x + E`` has an ``m x m`` matrix ``P``.

Per program (one tile = ``CHUNK`` steps x ``BH`` blocks of one sequence):

1. tile id from the int32 counter, decoded chunk-major (a tile waits only on smaller ids);
2. phase 1: sequential register recurrence over the chunk from a zero state: the local end state
   ``E [BH, MP]`` and the transfer product ``P = A_last ... A_first [BH, MP, MP]``
   (``P <- A_t P``, a broadcast-multiply-sum over the middle index: ``m^3`` FMAs per block-step
   on top of the state's ``m^2``); ``P`` is stored for every tile (the backward's chunk products
   come from it), then ``E`` with flag 1 (chunk 0 skips the publication: it starts from ``h0``,
   and skips phase 1 unless the backward needs its ``P``);
3. phase 2 (look-back), in two loops: walk the flags back from ``c - 1`` (flag 1: go on, flag 0:
   spin on the same chunk) to the newest flag-2 chunk ``j``; then start from its inclusive state
   and apply the (already published, never overwritten) aggregates of ``j+1 .. c-1`` oldest first,
   ``x <- P x + E``: a mat-vec per predecessor instead of composing the maps (``m^3``);
4. phase 3: re-run the recurrence over the chunk from the carry (``A``, ``b`` re-read: L2 hits on a
   GPU, the program just read them), store ``h``, publish the inclusive end state with flag 2,
   store the final state in the last chunk of each sequence.

Buffers per call: ``status`` int32 ``(ntile + 1,)`` zeroed (flags, then the counter), ``vals``
fp32: ``P (ntile, BH, MP, MP)``, then ``E`` and the inclusive state ``(ntile, BH, MP)`` each
(NaN under ``LRNN_SCAN_POISON``, fully written by their tile before any flag says so). Tile index
``(s, ph, c) -> (s * GH + ph) * NC + c``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fwd import _ring_ld, _seq_bounds
from .lookback import _publish, lookback_cfg

__all__ = ["block_lookback_forward", "launch_block_lookback", "block_lookback_cfg"]


@triton.jit
def _bd_run(A, Bv, Hout, x, P, t0, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM,
            MP: tl.constexpr, BH: tl.constexpr, WITH_P: tl.constexpr, STORE_H: tl.constexpr):
    """``x <- A_t x + b_t`` over ``[t0, t1)`` (``P <- A_t P`` too with ``WITH_P``), next step's
    loads issued before the current step is computed."""
    a_n, b_n = _ring_ld(A, Bv, t0, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
    for t in range(t0, t1):
        a3 = tl.reshape(a_n.to(tl.float32), (BH, MP, MP))
        bv = b_n.to(tl.float32)
        a_n, b_n = _ring_ld(A, Bv, t + 1, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM)
        x = tl.sum(a3 * x[:, None, :], axis=2) + bv
        if WITH_P:
            P = tl.sum(a3[:, :, :, None] * P[:, None, :, :], axis=2)
        if STORE_H:
            tl.store(Hout + t * HM + offs_s, x.to(Hout.dtype.element_ty), mask=mask_s)
    return x, P


@triton.jit
def _bd_look_back(Status, VP, VE, VI, base, c, offs_pv, offs_v,
                  BH: tl.constexpr, MP: tl.constexpr):
    """State entering chunk ``c`` of one (sequence, head tile), flags at ``Status[base + j]``.
    Loop 1 finds the newest chunk ``j < c`` with flag 2 (passing flag-1 chunks, spinning on 0;
    chunk 0 publishes 2 directly, so it ends there at the latest). Loop 2 applies the aggregates
    of ``j+1 .. c-1`` (each seen at flag 1 in loop 1, after its acquire) to ``j``'s state."""
    j = c - 1
    fl = tl.atomic_add(Status + base + j, 0, sem="acquire", scope="gpu")
    while fl != 2:
        if fl == 1:
            j = j - 1
        fl = tl.atomic_add(Status + base + j, 0, sem="acquire", scope="gpu")
    x = tl.load(VI + (base + j) * (BH * MP) + offs_v, volatile=True)
    for k in range(j + 1, c):
        pk = tl.load(VP + (base + k) * (BH * MP * MP) + offs_pv, volatile=True)
        ek = tl.load(VE + (base + k) * (BH * MP) + offs_v, volatile=True)
        x = tl.sum(pk * x[:, None, :], axis=2) + ek
    return x


@triton.jit(do_not_specialize=["T", "NC", "NSEQ"])
def _bd_lookback_fwd(A, Bv, Hout, Init, Final, Status, Vals, CU, T, H, NC, NSEQ,
                     M: tl.constexpr, MP: tl.constexpr, BH: tl.constexpr, CHUNK: tl.constexpr,
                     HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr,
                     PUBLISH_INCL: tl.constexpr, TILE_P: tl.constexpr):
    """``h_t = A_t h_{t-1} + b_t``; A ``(B*T, H, M, M)``, b/h ``(B*T, H, M)`` rows (``B == 1`` with
    ``CU``), one tile of ``CHUNK`` steps x ``BH`` blocks per program. ``Init``/``Final``
    ``(nseq, H, M)``, ``Status`` int32 ``(ntile + 1,)`` zeroed, ``Vals`` fp32 (module docstring).
    ``PUBLISH_INCL = False`` (tests only): beyond chunk 0 only aggregates are published, so every
    look-back walks over flag-1 chunks down to chunk 0. ``TILE_P``: chunk 0 computes its ``P`` too
    (only the backward's chunk products need it; otherwise chunk 0 skips phase 1)."""
    GH = tl.cdiv(H, BH)
    per = NSEQ * GH
    ntile = per * NC
    tid = tl.atomic_add(Status + ntile, 1)  # dynamic tile id (lookback.py: no deadlock)
    c = tid // per
    s = (tid % per) // GH
    ph = tid % GH
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    hl = tl.arange(0, BH)
    hb = ph * BH + hl
    i = tl.arange(0, MP)
    k = tl.arange(0, MP * MP)
    mh = hb < H
    mask_s = mh[:, None] & (i < M)[None, :]
    offs_s = hb[:, None] * M + i[None, :]
    if M == MP:  # A rows as (BH, MP*MP) vectors, as in fwd._bd_fwd_ring
        offs_a = hb[:, None] * (M * M) + k[None, :]
        mask_a = mh[:, None] & (k < M * M)[None, :]
    else:
        offs_a = hb[:, None] * (M * M) + ((k // MP) * M + k % MP)[None, :]
        mask_a = mh[:, None] & ((k // MP < M) & (k % MP < M))[None, :]
    HM = H * M
    HMM = HM * M
    offs_v = hl[:, None] * MP + i[None, :]
    offs_pv = hl[:, None, None] * (MP * MP) + i[None, :, None] * MP + i[None, None, :]
    base = (s.to(tl.int64) * GH + ph) * NC
    me = base + c
    ntl = ntile.to(tl.int64)
    VP = Vals
    VE = Vals + ntl * (BH * MP * MP)
    VI = VE + ntl * (BH * MP)
    # phase 1: local end state and transfer product (every tile: P also serves the backward)
    eye = ((i[:, None] == i[None, :]) & (i < M)[:, None]).to(tl.float32)
    P = tl.zeros([BH, MP, MP], dtype=tl.float32) + eye[None, :, :]
    x = tl.zeros([BH, MP], dtype=tl.float32)
    if TILE_P:
        x, P = _bd_run(A, Bv, Hout, x, P, t0, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM,
                       MP, BH, True, False)
    elif c > 0:
        x, P = _bd_run(A, Bv, Hout, x, P, t0, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM,
                       MP, BH, True, False)
    tl.store(VP + me * (BH * MP * MP) + offs_pv, P)
    # phase 2: carry
    carry = tl.zeros([BH, MP], dtype=tl.float32)
    if c == 0:
        if HAS_INIT:
            carry = tl.load(Init + s.to(tl.int64) * HM + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    elif t0 < eos:
        _publish(Status, me, VE + me * (BH * MP) + offs_v, x, 1)  # P stored above, before the barrier
        carry = _bd_look_back(Status, VP, VE, VI, base, c, offs_pv, offs_v, BH, MP)
    # phase 3: re-run from the carry, store h, publish the inclusive end state
    if (t0 < eos) | (c == 0):  # empty chunks past a sequence's end (varlen) do nothing more
        xend, P = _bd_run(A, Bv, Hout, carry, P, t0, t1, offs_a, offs_s, mask_a, mask_s, HM, HMM,
                          MP, BH, False, True)
        if PUBLISH_INCL:
            _publish(Status, me, VI + me * (BH * MP) + offs_v, xend, 2)
        elif c == 0:
            _publish(Status, me, VI + me * (BH * MP) + offs_v, xend, 2)
        if STORE_FINAL:
            if t1 == eos:  # the sequence's last chunk (chunk 0 of an empty sequence: h0)
                tl.store(Final + s.to(tl.int64) * HM + offs_s, xend, mask=mask_s)


def block_lookback_cfg(m, tune: dict, bd_cfg):
    """(CHUNK, MP, BH, num_warps): ``lb_chunk`` (64, power of two, shared with m = 1), ``lb_bh``
    and ``lb_nw_bd`` (default: the block kernels' ``BH`` and warps from ``scan._bd_cfg``, i.e.
    128 elements of ``A`` per step and program on one warp). Untimed guesses."""
    ch = lookback_cfg(tune)[0]
    mp, bh, nw, _ = bd_cfg(m)
    bh = tune.get("lb_bh", bh)
    if bh < 1 or bh & (bh - 1):
        raise ValueError(f"TUNE['lb_bh'] must be a power of two, got {bh}")
    return ch, mp, bh, tune.get("lb_nw_bd", nw)


def launch_block_lookback(A, b, h0, cu, tune, empty, bd_cfg, tile_p=True):
    """One launch. A ``(B, T, H, m, m)``, b ``(B, T, H, m)``, h0 ``(nseq, H, m)`` or None, cu
    int64 offsets or None; ``tile_p``: every tile's ``P`` in ``vals`` (else chunk 0's is the
    identity). Returns ``(h, final, status, vals, (CHUNK, MP, BH, NC, GH))``."""
    B, T, H, m = b.shape
    nseq = B if cu is None else cu.numel() - 1
    ch, mp, bh, nw = block_lookback_cfg(m, tune, bd_cfg)
    dev = b.device
    max_len = T if cu is None else int((cu[1:] - cu[:-1]).max().item())
    nc = max(1, triton.cdiv(max_len, ch))  # >= 1: chunk 0 writes h_final = h0 of empty sequences
    gh = triton.cdiv(H, bh)
    ntile = nseq * gh * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)  # 0 = unpublished, counter 0
    vals = empty((ntile * bh * (mp * mp + 2 * mp),), torch.float32, dev)
    h = empty(b.shape, b.dtype, dev)
    final = empty((nseq, H, m), torch.float32, dev)
    if ntile:
        _bd_lookback_fwd[(ntile,)](
            A, b, h, h0 if h0 is not None else b, final, status, vals, cu if cu is not None else b,
            T, H, nc, nseq, M=m, MP=mp, BH=bh, CHUNK=ch, HAS_INIT=h0 is not None, STORE_FINAL=True,
            VARLEN=cu is not None, PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)),
            TILE_P=tile_p, num_warps=nw)
    return h, final, status, vals, (ch, mp, bh, nc, gh)


def tile_products(vals, nseq, H, m, chunk, meta):
    """Products ``(nseq, nc, H, m, m)`` of ``A`` over chunks of ``chunk = k * CHUNK`` steps from the
    tiles' ``P`` (later tiles on the left; tiles past a sequence's end are the identity)."""
    ch, mp, bh, nc_t, gh = meta
    k = chunk // ch
    p = vals[:nseq * gh * nc_t * bh * mp * mp].view(nseq, gh, nc_t, bh, mp, mp)
    p = p.permute(0, 2, 1, 3, 4, 5).reshape(nseq, nc_t, gh * bh, mp, mp)[:, :, :H, :m, :m]
    nc = triton.cdiv(nc_t, k)  # = ceil(max_len / chunk): nc_t = ceil(max_len / CHUNK)
    eye = torch.eye(m, dtype=p.dtype, device=p.device)
    if nc * k > nc_t:
        p = torch.cat([p, eye.expand(nseq, nc * k - nc_t, H, m, m)], 1)
    p = p[:, :nc * k].reshape(nseq, nc, k, H, m, m)
    while p.shape[2] > 1:  # pairwise, later on the left: log2(k) batched matmuls
        if p.shape[2] % 2:
            p = torch.cat([p, eye.expand(nseq, nc, 1, H, m, m)], 2)
        p = p[:, :, 1::2] @ p[:, :, 0::2]
    return p[:, :, 0].contiguous()


def block_lookback_forward(A, b, h0, cu, chunk, tune, empty, bd_cfg, summary):
    """``scan._bd_forward``'s contract: ``(h, final, P)``, ``P (nseq, nc, H, m, m)`` the products of
    ``A`` over the backward's chunks of length ``chunk`` (None: no ``P``). ``chunk`` a multiple of
    ``CHUNK`` (``scan._bd_apply`` aligns it): from the tiles; otherwise ``summary(chunk)`` (the
    chunked forward's summary pass)."""
    tile_p = chunk is not None and chunk % block_lookback_cfg(b.shape[-1], tune, bd_cfg)[0] == 0
    h, final, status, vals, meta = launch_block_lookback(A, b, h0, cu, tune, empty, bd_cfg, tile_p)
    if chunk is None:
        return h, final, None
    B, T, H, m = b.shape
    max_len = T if cu is None else int((cu[1:] - cu[:-1]).max().item())
    nc = triton.cdiv(max_len, chunk)
    if chunk % meta[0] == 0:
        P = tile_products(vals, final.shape[0], H, m, chunk, meta)
        assert P.shape[1] == nc, (P.shape, nc)
        return h, final, P
    return h, final, summary(chunk)
