"""Single-pass decoupled look-back forward for blocks (m >= 2), chunk products on tensor cores.

Where (``bd_lookback_use``): by default forwards without gradients that the chunk rule would
time-chunk, from ``m = 16`` on (``TUNE["bd_lookback"] = "auto"``, ``bdlb_min_m``); ``True``:
every such forward; ``"always"``: every forward without gradients (to time it where the default
runs one pass, e.g. B8 T2048 N768). Below ``m = 16`` and with gradients the three-pass chunked
forward (``scan._bd_forward``) runs.

Why: the three-pass forward launches the chunk summaries, a carry scan and the re-run from the
carries, and reads ``A`` twice. Here one program per (sequence, block group, chunk) does both passes
over its chunk back to back. Measured (H100, B1 T16384 N768, fifteenth session): m = 16 0.634 ms
against 0.675, m = 32 1.483 against 1.778; but the second read of ``A`` still comes from DRAM
(Nsight Compute: L2 hit rate 12 % with 64-step chunks; about 150 MB of ``A`` is in flight between a
chunk's two reads), so it saves launches and the carry pass, not bytes (README.md).

Per program (tiles as in ``summary.py``: ``NT`` block-diagonal ``D x D`` tiles of ``D / MP``
blocks):

1. tile id from an int32 counter (``tl.atomic_add``), chunk-major, so a program only waits on
   chunks handed out before it (``lookback.py`` explains why this cannot deadlock);
2. summary: ``P <- A_t P`` (``tl.dot``) and ``E <- A_t E + b_t`` over the chunk from ``P = I``,
   ``E = 0``; store ``P``, publish ``E`` with flag 1 (chunk 0 skips this);
3. look back over the predecessors of the same (sequence, block group), newest first: flag 2 =
   inclusive end state (stop), 1 = aggregate ``x -> P x + E`` (compose, go on), 0 = spin;
4. publish this chunk's inclusive end state ``P carry + E`` with flag 2 *before* the re-run, so
   successors need not wait for it;
5. re-run the chunk from ``carry`` (mat-vec per step), writing ``h``; the last sequence chunk also
   writes ``h_final`` (the re-run's end state, so it equals the last row of ``h``).

Memory ordering: as in ``lookback.py`` (values, ``bar.sync``, release flag; acquire flag loads,
``ld.volatile`` values). Checked in the sm_90a PTX from Triton 3.6 (``tools/aot_check.py compile
--ptx-dir``, 2026-11-26): the flag is one thread's ``ld.global.gpu.acquire``, broadcast through
shared memory between two ``bar.sync`` (so every thread takes the same branch), the values are
``ld.volatile.global`` after it, and each publish is ``bar.sync`` then one thread's
``atom.global.gpu.release.exch``; 16 x 16 tiles use ``mma.sync ... tf32`` (tf32x3), 32 x 32 FMAs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._host import cdiv, max_seq_len, next_pow2
from .fwd import _seq_bounds
from .lookback import _publish
from .lookback_thread import bd_thread_lookback_forward
from .summary import _chunk_summary, _tile_dot, _tile_layout, summary_dot_cfg, summary_stages

__all__ = ["bd_lookback_forward", "bd_lookback_cfg", "bd_lookback_use"]


@triton.jit
def _bd_look_back(Status, VP, VE, VI, base, c, offs_m, offs_v,
                  D: tl.constexpr, NT: tl.constexpr, PREC: tl.constexpr):
    """Carry into chunk ``c`` from chunks ``c-1, c-2, ...`` (flags ``Status[base + j]``): the
    accumulated map ``x_c = Pacc x + Eacc`` takes each aggregate ``(P_j, E_j)`` on its right until
    a chunk with its inclusive state (flag 2; chunk 0 always publishes one)."""
    r = tl.arange(0, D)
    pacc = tl.zeros([NT, D, D], dtype=tl.float32) + (r[:, None] == r[None, :]).to(tl.float32)[None, :, :]
    eacc = tl.zeros([NT, D], dtype=tl.float32)
    j = c - 1
    done = c * 0
    while done == 0:
        fl = tl.atomic_add(Status + base + j, 0, sem="acquire", scope="gpu")
        if fl == 2:
            inc = tl.load(VI + (base + j) * (NT * D) + offs_v, volatile=True)
            eacc = tl.sum(pacc * inc[:, None, :], axis=2) + eacc
            done = done + 1
        elif fl == 1:
            p = tl.load(VP + (base + j) * (NT * D * D) + offs_m, volatile=True)
            e = tl.load(VE + (base + j) * (NT * D) + offs_v, volatile=True)
            eacc = tl.sum(pacc * e[:, None, :], axis=2) + eacc
            pacc = _tile_dot(pacc, p, D, NT, PREC)
            j = j - 1
    return eacc


@triton.jit(do_not_specialize=["T", "NC", "NSEQ"])
def _bd_lookback_fwd(A, Bv, Hout, Init, Final, Status, VP, VE, VI, CU, T, H, NC, NSEQ,
                     M: tl.constexpr, MP: tl.constexpr, D: tl.constexpr, NT: tl.constexpr,
                     CHUNK: tl.constexpr, PREC: tl.constexpr, NS: tl.constexpr,
                     HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr, VARLEN: tl.constexpr,
                     PUBLISH_INCL: tl.constexpr):
    """``A`` rows ``(B*T, H, M, M)``, ``Bv``/``Hout`` rows ``(B*T, H, M)``; ``Init``/``Final``
    ``(nseq, H, M)``; ``Status`` int32 ``(ntile + 1,)`` zeroed; ``VP (ntile, NT, D, D)``,
    ``VE``/``VI (ntile, NT, D)`` fp32. ``PUBLISH_INCL = False`` (tests only): chunks beyond 0
    publish only aggregates, so every look-back walks to chunk 0."""
    GH = tl.cdiv(H, NT * (D // MP))  # block groups per sequence
    per = NSEQ * GH
    ntile = per * NC
    tid = tl.atomic_add(Status + ntile, 1)  # dynamic tile id, chunk-major (lookback.py)
    c = tid // per
    s = (tid % per) // GH
    pg = tid % GH
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    mrow, mask_a, offs_a, offs_s = _tile_layout(pg, H, M, MP, D, NT)
    r = tl.arange(0, D)
    tt = tl.arange(0, NT)
    offs_m = tt[:, None, None] * (D * D) + r[None, :, None] * D + r[None, None, :]
    offs_v = tt[:, None] * D + r[None, :]
    HM = H * M
    HMM = HM * M
    S, e = _chunk_summary(A, Bv, t0, t1, HM, HMM, mrow, mask_a, offs_a, offs_s, D, NT, PREC, NS)
    base = (s.to(tl.int64) * GH + pg) * NC
    me = base + c
    carry = tl.zeros([NT, D], dtype=tl.float32)
    if c == 0:
        if HAS_INIT:
            carry = tl.load(Init + s.to(tl.int64) * HM + offs_s, mask=mrow, other=0.0).to(tl.float32)
    elif t0 < eos:
        tl.store(VP + me * (NT * D * D) + offs_m, S)  # before _publish's barrier and flag
        _publish(Status, me, VE + me * (NT * D) + offs_v, e, 1)
        carry = _bd_look_back(Status, VP, VE, VI, base, c, offs_m, offs_v, D, NT, PREC)
    if (t0 < eos) | (c == 0):  # empty chunks past a sequence's end (varlen) do nothing more
        xend = tl.sum(S * carry[:, None, :], axis=2) + e
        if PUBLISH_INCL:
            _publish(Status, me, VI + me * (NT * D) + offs_v, xend, 2)
        elif c == 0:
            _publish(Status, me, VI + me * (NT * D) + offs_v, xend, 2)
        x = carry
        for t in tl.range(t0, t1, num_stages=NS):
            a = tl.load(A + t * HMM + offs_a, mask=mask_a, other=0.0).to(tl.float32)
            bt = tl.load(Bv + t * HM + offs_s, mask=mrow, other=0.0).to(tl.float32)
            x = tl.sum(a * x[:, None, :], axis=2) + bt
            tl.store(Hout + t * HM + offs_s, x.to(Hout.dtype.element_ty), mask=mrow)
        if STORE_FINAL:
            if t1 == eos:  # the sequence's last chunk (chunk 0 of an empty sequence: h0)
                tl.store(Final + s.to(tl.int64) * HM + offs_s, x, mask=mrow)


def bd_lookback_cfg(m, tune):
    """``(CHUNK, D, NT, PREC, num_warps)``: ``TUNE['bdlb_chunk']`` (64, a power of two) and the
    tile keys of ``summary.summary_dot_cfg`` (``sum_nt``, ``sum_prec``, ``sum_nw``)."""
    ch = tune.get("bdlb_chunk", 64)
    if ch < 1 or ch & (ch - 1):
        raise ValueError(f"TUNE['bdlb_chunk'] must be a power of two, got {ch}")
    return (ch,) + summary_dot_cfg(m, tune)


def bd_lookback_use(tune: dict, m: int, chunk) -> bool:
    """This look-back pass instead of the chunked forward? Forwards without
    gradients only. ``TUNE['bd_lookback']``: ``"auto"`` (default) where the forward would chunk
    and ``m >= TUNE['bdlb_min_m']`` (16), ``True`` wherever it would chunk, ``"always"`` also
    where it would not (to time it at B8 T2048 N768), ``False`` never. H100, fp32, B1 T16384
    N768, CUDA graphs (RESULTS.md, 2026-11-26 fifteenth session): m = 16 0.634 ms against 0.675
    chunked, m = 32 1.483 against 1.778; with 3 stages m = 8 0.553 against 0.551 and m = 4 0.528
    against 0.238 (its 16 x 16 tensor-core tiles are mostly zeros there)."""
    mode = tune.get("bd_lookback", "auto")
    if mode not in (False, True, "always", "auto"):
        raise ValueError(f"TUNE['bd_lookback'] must be 'auto', False, True or 'always', got {mode!r}")
    if mode == "auto":
        return chunk is not None and m >= tune.get("bdlb_min_m", 16)
    return mode == "always" or (mode is True and chunk is not None)


def bd_lookback_forward(A, b, h0, cu, tune, empty, max_len=None):
    """One launch. ``A (B, T, H, m, m)``, ``b (B, T, H, m)``, ``h0 (nseq, H, m)`` or None, ``cu``
    int64 offsets or None; ``empty`` allocates outputs (the launcher's NaN-poisoning ``_empty``).
    Returns ``(h, h_final, None)`` (``scan._bd_forward``'s contract, no chunk products: forward
    only). ``TUNE['bdlb_kind']``: ``"dot"`` (default) this kernel, ``"thread"`` one block per
    thread (``lookback_thread.py``, ``m <= 8``, opt-in)."""
    kind = tune.get("bdlb_kind", "dot")
    if kind not in ("dot", "thread"):
        raise ValueError(f"TUNE['bdlb_kind'] must be 'dot' or 'thread', got {kind!r}")
    if kind == "thread":
        return bd_thread_lookback_forward(A, b, h0, cu, tune, empty, max_len)
    B, T, H, m = b.shape
    nseq = B if cu is None else cu.numel() - 1
    ch, d, nt, prec, nw = bd_lookback_cfg(m, tune)
    # 6 stages: H100, B1 T16384 N768, m = 16 0.634 ms against 0.654 with 3, m = 32 1.483 vs 1.515
    ns = summary_stages(tune, 6)
    mp = next_pow2(m)
    dev = b.device
    max_len = max_seq_len(T, cu, max_len)
    nc = max(1, cdiv(max_len, ch))  # >= 1: chunk 0 writes h_final = h0 of empty sequences
    gh = cdiv(H, nt * (d // mp))
    ntile = nseq * gh * nc
    status = torch.zeros(ntile + 1, dtype=torch.int32, device=dev)  # 0 = nothing published
    vp = empty((ntile, nt, d, d), torch.float32, dev)
    ve = empty((ntile, nt, d), torch.float32, dev)
    vi = empty((ntile, nt, d), torch.float32, dev)
    h = empty(b.shape, b.dtype, dev)
    final = empty((nseq, H, m), torch.float32, dev)
    if ntile:
        _bd_lookback_fwd[(ntile,)](
            A, b, h, h0 if h0 is not None else b, final, status, vp, ve, vi,
            cu if cu is not None else b, T, H, nc, nseq, M=m, MP=mp, D=d, NT=nt, CHUNK=ch, PREC=prec,
            NS=ns, HAS_INIT=h0 is not None, STORE_FINAL=True,
            VARLEN=cu is not None, PUBLISH_INCL=bool(tune.get("lb_publish_incl", True)),
            num_warps=nw, num_stages=ns)
    return h, final, None
