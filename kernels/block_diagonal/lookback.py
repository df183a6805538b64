"""Single-pass decoupled look-back forward for the diagonal scan (m = 1).

``scan.TUNE["fwd_lookback"]`` ("auto" by default: forwards without gradients that the default rule
would time-chunk; True / False force it) routes ``diagonal_scan``'s forward here. One launch
reads ``a`` and ``b`` once and writes ``h`` once, whatever the number of sequences: time is cut
into chunks of ``CHUNK`` steps that become independent programs, and the carry between chunks is
passed through a status buffer in global memory instead of a second pass over the inputs (the
3-pass chunked forward of ``scan._diag_forward`` reads them twice).

Per program (one tile = ``CHUNK`` steps x ``BN`` channels of one sequence):

1. take a tile id from an int32 counter (``tl.atomic_add``): ids are handed out in the order
   programs *start*, so a tile only ever waits on tiles already running (no deadlock whatever the
   hardware schedule, and whatever order the grid is launched in);
2. load ``a``, ``b`` ([CHUNK, BN]), in-chunk scan from a zero state (``tl.associative_scan``):
   ``h_local_t = cb_t``, ``prod_{u<=t} a_u = ca_t``; the chunk aggregate is ``(P, E)`` = last row;
3. publish ``(P, E)`` with flag 1 (chunk 0 skips this: it knows its end state at once);
4. look back over the predecessors of the same (sequence, channel tile), ``W`` chunks per step:
   flag 2 = inclusive end state published (stop there), 1 = aggregate (compose, go on), 0 = spin;
5. ``h = ca * carry + cb``, store ``h``, publish the end state ``P carry + E`` with flag 2.

Buffers per call: ``status`` int32 ``(ntile + 1,)`` (flags, then the tile counter; zeroed by one
``torch.zeros`` per call, the protocol needs 0 = "nothing published"), ``vals`` fp32
``(3, ntile, BN)``: ``P``, ``E``, inclusive state (never read before their flag says so; NaN under
``LRNN_SCAN_POISON``). Tile index ``(s, pn, c) -> (s * GN + pn) * NC + c``; tile ids are handed out
chunk-major (all (s, pn) of chunk 0, then chunk 1, ...), so a tile's predecessor was handed out
``nseq * GN`` ids earlier and is usually finished or nearly so (short look-backs).

Memory ordering (GPU; the interpreter runs programs one at a time): the publisher's threads store
their values, ``tl.debug_barrier()`` (bar.sync: CTA-scope ordering), then one thread does
``atom.release.gpu`` on the flag; the reader's flag loads are ``atom.acquire.gpu`` (Triton
broadcasts an atomic's result through shared memory behind a bar.sync, so every thread's later
loads are ordered after the acquire) and the values are read with ``ld.volatile`` (L2, never a
stale L1 line). Checked in the sm_90 PTX; on an H100 (Triton 3.6, 2026-11-24) the many-tiles
tests (thousands of tiles in flight, repeated, varlen) pass and B1 T16384 N768 fp32 runs in 0.113 ms
(44 % of copy bandwidth) against 0.295 ms for the chunked 3-pass forward; with 4 warps and
4-chunk windows (2026-11-26, ``lookback_cfg``) in 0.069 ms (73 %).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, diag_vec, max_seq_len, row_divisor
from .fwd import _affine_combine, _diag_fwd_kernel, _seq_bounds

__all__ = ["diag_lookback_forward", "launch_diag_lookback", "lookback_cfg"]


@triton.jit
def _last_row(x, R: tl.constexpr):
    """Row ``R - 1`` of a ``(R, BN)`` tensor (exact: adds zeros)."""
    r = tl.arange(0, R)
    return tl.sum(tl.where((r == R - 1)[:, None], x, 0.0), axis=0)


@triton.jit
def _publish(Status, me, ptr, v, flag):
    """Values first (every thread), CTA barrier, then the flag with release semantics."""
    tl.store(ptr, v)
    tl.debug_barrier()
    tl.atomic_xchg(Status + me, flag, sem="release", scope="gpu")


@triton.jit
def _next_tile(Status, NSEQ, G, NC):
    """This program's tile ``(chunk, sequence, group, ntile)`` from the int32 tile counter at
    ``Status[ntile]`` (``G`` channel or block groups a sequence, ``NC`` chunks): ids are handed
    out in the order programs start and decoded chunk-major, so a tile's predecessors in the
    look-back got smaller ids (module docstring: no deadlock)."""
    per = NSEQ * G
    ntile = per * NC
    tid = tl.atomic_add(Status + ntile, 1, sem="relaxed")
    return tid // per, (tid % per) // G, tid % G, ntile


@triton.jit
def _window_flags(Status, base, hi, w, W: tl.constexpr):
    """The look-back window ``hi-W .. hi-1`` (``w = tl.arange(0, W)``): its chunk ids ``j``, which
    exist (``ok``), and from their flags (acquire; rows before chunk 0 read as 2) the newest row
    with an inclusive state ``r2`` and the newest unpublished row ``rz`` (-1: none). The window is
    usable when ``(rz < r2) | (rz < 0)``; else the caller spins (re-reads it)."""
    j = hi - W + w
    ok = j >= 0
    fl = tl.atomic_add(Status + base + j, 0, mask=ok, sem="acquire", scope="gpu")
    fl = tl.where(ok, fl, 2)
    r2 = tl.max(tl.where(fl == 2, w, -1), axis=0)
    rz = tl.max(tl.where(fl == 0, w, -1), axis=0)
    return j, ok, r2, rz


@triton.jit
def _look_back(Status, VA, VB, VI, base, c, bn, BN: tl.constexpr, W: tl.constexpr):
    """Carry into chunk ``c`` (the state at its start) from the chunks ``0..c-1`` of one
    (sequence, channel tile), whose flags are ``Status[base + j]``. A window holds chunks
    ``hi-W .. hi-1`` oldest first; each is an affine map ``x -> P x + E`` (flag 1) or the constant
    map ``x -> incl`` (flag 2, written as ``P = 0``). The window is usable once no chunk newer than
    its newest flag-2 chunk is still at 0; its maps compose (``tl.associative_scan``, ordered) into
    ``(WA, WB)`` and the accumulated map ``x_c = acc_a x + acc_b`` takes it on its right. A window
    with a flag 2 ends the walk (``acc_a`` becomes 0). Chunk 0 publishes flag 2 directly, so the
    walk stops at chunk 0 at the latest; rows before chunk 0 read as flag 2 and are never used."""
    w = tl.arange(0, W)
    acc_a = tl.full([BN], 1.0, tl.float32)
    acc_b = tl.zeros([BN], dtype=tl.float32)
    hi = c
    done = c * 0
    while done == 0:
        j, ok, r2, rz = _window_flags(Status, base, hi, w, W)
        if (rz < r2) | (rz < 0):  # else spin: re-read the window
            offs = (base + j)[:, None] * BN + bn[None, :]
            agg = ((w > r2) & ok)[:, None]  # flag 1 there (nothing newer than r2 is 0 or 2)
            inc = ((w == r2) & ok)[:, None]
            ga = tl.load(VA + offs, mask=agg, other=1.0, volatile=True)
            gb = tl.load(VB + offs, mask=agg, other=0.0, volatile=True)
            gi = tl.load(VI + offs, mask=inc, other=0.0, volatile=True)
            newest2 = (w == r2)[:, None]
            ga = tl.where(newest2, 0.0, ga)  # rows older than r2 stay identity (1, 0)
            gb = tl.where(newest2, gi, gb)
            sa, sb = tl.associative_scan((ga, gb), 0, _affine_combine)
            acc_b = acc_a * _last_row(sb, W) + acc_b
            acc_a = acc_a * _last_row(sa, W)
            hi = hi - W
            if r2 >= 0:
                done = done + 1
    return acc_b


@triton.jit(do_not_specialize=["T", "NC", "NSEQ"])
def _diag_lookback_fwd(Aa, Bv, Hout, Init, Final, Status, Vals, CU, T, N, NC, NSEQ,
                       CHUNK: tl.constexpr, BN: tl.constexpr, W: tl.constexpr,
                       HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr,
                       PUBLISH_INCL: tl.constexpr, NV: tl.constexpr = 1, VEC: tl.constexpr = 0):
    """``h_t = a_t h_{t-1} + b_t``, a, b, h ``(B*T, N)`` rows (``B == 1`` with ``CU``), one tile of
    ``CHUNK x BN`` per program. ``Init (nseq, N)`` h0, ``Final (nseq, N)`` fp32, ``Status``
    int32 ``(ntile + 1,)`` zeroed, ``Vals`` fp32 ``(3, ntile, BN)``. ``PUBLISH_INCL = False``
    (tests only) publishes only aggregates beyond chunk 0, so every look-back walks to chunk 0.
    ``NV``: a power of two dividing ``N`` (``_host.row_divisor``); ``VEC``: ``_host.diag_vec``."""
    N = (N // NV) * NV  # proven NV-aligned: vector loads where N % 16 != 0 (fwd._diag_fwd_kernel)
    GN = tl.cdiv(N, BN)
    c, s, pn, ntile = _next_tile(Status, NSEQ, GN, NC)  # chunk-major dynamic tile id
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    bn = tl.arange(0, BN)
    n = pn * BN + bn
    if VEC > 0:
        n = tl.max_contiguous(n, VEC)  # see fwd._diag_fwd_kernel
    mn = n < N
    t = t0 + tl.arange(0, CHUNK)
    m2 = (t < t1)[:, None] & mn[None, :]  # chunks never cross eos: rows past it are identity
    offs = t[:, None] * N + n[None, :]
    av = tl.load(Aa + offs, mask=m2, other=1.0).to(tl.float32)
    bv = tl.load(Bv + offs, mask=m2, other=0.0).to(tl.float32)
    ca, cb = tl.associative_scan((av, bv), 0, _affine_combine)
    pa = _last_row(ca, CHUNK)
    pb = _last_row(cb, CHUNK)
    base = (s.to(tl.int64) * GN + pn) * NC
    me = base + c
    VA = Vals
    VB = Vals + ntile.to(tl.int64) * BN
    VI = Vals + 2 * ntile.to(tl.int64) * BN
    # P of every tile (1 past eos) also gives the backward its chunk products (diag_lookback_forward)
    tl.store(VA + me * BN + bn, pa)
    carry = tl.zeros([BN], dtype=tl.float32)
    if c == 0:
        if HAS_INIT:
            carry = tl.load(Init + s.to(tl.int64) * N + n, mask=mn, other=0.0).to(tl.float32)
    elif t0 < eos:
        _publish(Status, me, VB + me * BN + bn, pb, 1)  # VA stored above, before the barrier
        carry = _look_back(Status, VA, VB, VI, base, c, bn, BN, W)
    if (t0 < eos) | (c == 0):  # empty chunks past a sequence's end (varlen) do nothing more
        xend = pa * carry + pb
        # the end state before h: the flag's release fence then waits for one row of stores
        if PUBLISH_INCL:
            _publish(Status, me, VI + me * BN + bn, xend, 2)
        elif c == 0:
            _publish(Status, me, VI + me * BN + bn, xend, 2)
        h = ca * carry[None, :] + cb
        tl.store(Hout + offs, h.to(Hout.dtype.element_ty), mask=m2)
        if STORE_FINAL:
            if t1 == eos:  # the sequence's last chunk (chunk 0 of an empty sequence: h0)
                tl.store(Final + s.to(tl.int64) * N + n, xend, mask=mn)


def lookback_cfg(tune: dict, bwd: bool = False):
    """(CHUNK, BN, W, num_warps) from ``TUNE`` keys ``lb_chunk`` (128), ``lb_bn`` (32),
    ``lb_window`` (4) and ``lb_nw`` (4, 8 from 256 x 32 tiles on), shared by the forward and the
    backward; with ``bwd=True`` the key ``lb_bwd_window``, if set, gives the backward's window
    (an opt-in: 8 / 16 lost on an H200, B1 T16384 N768 fwd+bwd fp32 0.149 -> 0.203 / 0.168 ms,
    bf16 0.138 -> 0.189 / 0.159; fortieth session).
    H100, fp32, CUDA graphs, medians of 5 interleaved rounds (2026-11-26,
    ``tools/lookback_repeat.py``, the words set of commit ff44276), B1 T16384 N768 with 128 x 32
    tiles: forward 0.0698 ms with 4 warps and 4-chunk windows against 0.1039 with 8 warps and
    16-chunk windows (the old defaults), forward+backward 0.1689 against 0.2430; 64 x 32 tiles
    0.0745 / 0.1789. (2026-11-24, 8 warps: 128 x 32 0.113 ms, 32 x 32 0.115, 64 x 32 0.138,
    64 x 64 0.205.) ptxas (sm_90a): 128 x 32 with 4 warps 144 registers (forward), 148
    (backward), no spills."""
    ch = tune.get("lb_chunk", 128)
    bn = tune.get("lb_bn", 32)
    wkey = "lb_bwd_window" if bwd and "lb_bwd_window" in tune else "lb_window"
    w = tune.get(wkey, 4)
    for k, v in (("lb_chunk", ch), ("lb_bn", bn), (wkey, w)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"TUNE[{k!r}] must be a power of two, got {v}")
    # 4 warps up to 128 x 32 tiles (measured), 8 from 256 x 32 on: with 4 there, ptxas (sm_90a)
    # gave the forward 255 registers and the backward 116 bytes of spills a thread (8: 145, 185)
    nw = tune.get("lb_nw", max(4, min(8, ch * bn // 1024)))
    if nw not in (1, 2, 4, 8, 16):
        raise ValueError(f"TUNE['lb_nw'] must be 1, 2, 4, 8 or 16 warps, got {nw!r}")
    return ch, bn, w, nw


def launch_diag_lookback(a, b, h0, cu, tune, empty, max_len=None):
    """One launch. a, b ``(B, T, N)``, h0 ``(nseq, N)`` or None, cu int64 offsets or None.
    Returns ``(h, final, status, vals, (CHUNK, BN, NC, GN))``; ``empty`` allocates outputs (the
    launcher's NaN-poisoning ``_empty``)."""
    B, T, N = b.shape
    nseq = B if cu is None else cu.numel() - 1
    ch, bn, w, nw = lookback_cfg(tune)
    dev = b.device
    max_len = max_seq_len(T, cu, max_len)
    nc = max(1, cdiv(max_len, ch))  # >= 1: chunk 0 writes h_final = h0 of empty sequences
    gn = cdiv(N, bn)
    ntile = nseq * gn * nc
    # zeroed per call: flags 0 = nothing published, and the tile counter must start at 0
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)
    vals = empty((3, ntile, bn), torch.float32, dev)
    h = empty(b.shape, b.dtype, dev)
    final = empty((nseq, N), torch.float32, dev)
    if ntile:
        _diag_lookback_fwd[(ntile,)](
            a, b, h, h0 if h0 is not None else b, final, status, vals, cu if cu is not None else b,
            T, N, nc, nseq, CHUNK=ch, BN=bn, W=w, HAS_INIT=h0 is not None, STORE_FINAL=True,
            VARLEN=cu is not None, PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)),
            NV=row_divisor(N), VEC=diag_vec(b.element_size(), tune), num_warps=nw)
    return h, final, status, vals, (ch, bn, nc, gn)


def diag_lookback_forward(a, b, h0, cu, chunk, tune, empty, diag_cfg, max_len=None):
    """``scan._diag_forward``'s contract: ``(h, final, P)``, ``P (nseq, nc, N)`` the products of
    ``a`` over the backward's chunks of length ``chunk`` (None: one-pass backward, no ``P``).
    When ``chunk`` is a multiple of ``CHUNK`` (``plan.diag_plan`` aligns it so), ``P`` is a
    product over groups of tile products already in ``vals``; otherwise one extra summary pass
    (the chunked forward's pass 1, reads ``a`` and ``b``)."""
    h, final, status, vals, (ch, bn, nc_t, gn) = launch_diag_lookback(a, b, h0, cu, tune, empty, max_len)
    if chunk is None:
        return h, final, None
    B, T, N = b.shape
    nseq = final.shape[0]
    max_len = max_seq_len(T, cu, max_len)
    nc = cdiv(max_len, chunk)
    if chunk % ch == 0:
        k = chunk // ch
        p = vals[0].view(nseq, gn, nc_t, bn).permute(0, 2, 1, 3).reshape(nseq, nc_t, gn * bn)[..., :N]
        if nc * k > nc_t:
            p = torch.cat([p, p.new_ones(nseq, nc * k - nc_t, N)], 1)
        return h, final, p[:, :nc * k].reshape(nseq, nc, k, N).prod(2).contiguous()
    bt, bnf, nw, _ = diag_cfg(N, nseq, b.device)
    P = empty((nseq, nc, N), torch.float32, b.device)
    E = empty((nseq, nc, N), torch.float32, b.device)
    _diag_fwd_kernel[(cdiv(N, bnf), nseq, nc)](
        a, b, b, b, E, P, cu if cu is not None else b, T, N, chunk, nc, BT=bt, BN=bnf,
        HAS_INIT=False, STORE_H=False, STORE_FINAL=True, STORE_P=True, VARLEN=cu is not None,
        NV=row_divisor(N), VEC=diag_vec(b.element_size(), tune), num_warps=nw)
    return h, final, P
