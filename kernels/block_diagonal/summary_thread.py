"""Chunk summaries with one block per thread: ``P = A_{t1-1} ... A_{t0}`` and the zero-start end
state ``E`` of each chunk, held in one thread's registers (``m <= 8``).

Why: ``summary.py`` runs ``P <- A_t P`` as one ``tl.dot`` a step on block-diagonal 16 x 16 tiles.
At ``m = 4 .. 8`` that chain is bound by its layout changes (the dot's accumulator becomes the next
dot's operand through shared memory: Nsight Compute, m = 8, L1/TEX 80 %, DRAM 37 %; about 350 us
at B1 T16384 N768 for ``m = 4, 8, 16`` alike, README.md), and the ring summaries read ``A`` once per
column of ``[P | E]``. Here a thread owns one block: the ``m^2 + m`` entries of ``(P, E)`` are a
tuple of ``(BH,)`` registers, the step's ``A_t`` arrives as ``m^2`` more (16-byte row loads where
``m`` is a multiple of 4), and ``P <- A_t P``, ``E <- A_t E + b_t`` are ``m^3 + m^2`` FMAs with no
exchange between threads. ``A`` is read once. ptxas (sm_90a, Triton 3.6) at ``m = 8``: 198
registers and 641 instructions a step without the next step's loads issued first, 255 with them
(as here), no spills. Measured (H100, B1 T16384 N768, README.md "Thread summaries"): m = 8 200 us
for ``A`` and ``b`` (2.3 TB/s), against 361 us for ``summary.py``.

Output as ``summary.launch_summary_dot``: ``P (nseq, nc, H, m, m)``, ``E (nseq, nc, H, m)``
fp32; chunks past a sequence's end are the identity map (``P = I``, ``E = 0``).
"""
import triton
import triton.language as tl

from .._host import cdiv
from .fwd import _seq_bounds

__all__ = ["THREAD_MAX_M", "launch_summary_thread"]

THREAD_MAX_M = 8  # (P, E) and one A_t: m^2 + m + m^2 registers a thread; 16 would spill


@triton.jit
def _load_entries(X, offs, ok, N: tl.constexpr, VW: tl.constexpr):
    """``X[offs + 0 .. N-1]`` per lane as an ``N``-tuple of ``(BH,)`` fp32 tensors (0 where ``ok``
    is false); ``VW``-wide vector loads (4, 2 or 1) split in registers."""
    out = ()
    if VW == 4:
        for q in tl.static_range(N // 4):
            v = tl.load(X + offs[:, None] + (4 * q + tl.arange(0, 4))[None, :], mask=ok[:, None],
                        other=0.0).to(tl.float32)
            even, odd = tl.split(tl.reshape(v, (v.shape[0], 2, 2)))  # (0, 2), (1, 3)
            v0, v2 = tl.split(even)
            v1, v3 = tl.split(odd)
            out = out + (v0, v1, v2, v3)
    elif VW == 2:
        for q in tl.static_range(N // 2):
            v = tl.load(X + offs[:, None] + (2 * q + tl.arange(0, 2))[None, :], mask=ok[:, None],
                        other=0.0).to(tl.float32)
            v0, v1 = tl.split(v)
            out = out + (v0, v1)
    else:
        for q in tl.static_range(N):
            out = out + (tl.load(X + offs + q, mask=ok, other=0.0).to(tl.float32),)
    return out


@triton.jit
def _step(P, E, a, bt, M: tl.constexpr):
    """``(A P, A E + b)`` for row-major ``M x M`` tuples ``P``, ``a`` and ``M``-tuples ``E``, ``bt``."""
    newp = ()
    newe = ()
    for i in tl.static_range(M):
        for j in tl.static_range(M):
            acc = a[i * M] * P[j]
            for k in tl.static_range(1, M):
                acc = acc + a[i * M + k] * P[k * M + j]
            newp = newp + (acc,)
        acc = a[i * M] * E[0] + bt[i]
        for k in tl.static_range(1, M):
            acc = acc + a[i * M + k] * E[k]
        newe = newe + (acc,)
    return newp, newe


@triton.jit
def _identity_map(M: tl.constexpr, BH: tl.constexpr):
    """The map ``x -> I x + 0`` as ``(P, E)`` tuples of ``(BH,)`` fp32 (``M*M`` and ``M`` of them)."""
    P = ()
    for k in tl.static_range(M * M):
        P = P + (tl.full([BH], 1.0 if k % (M + 1) == 0 else 0.0, tl.float32),)
    E = ()
    for k in tl.static_range(M):
        E = E + (tl.zeros([BH], tl.float32),)
    return P, E


@triton.jit
def _load_step(A, Bv, t, t1, H, hb, mh, M: tl.constexpr, VW: tl.constexpr, VWB: tl.constexpr):
    """Step ``t``'s ``A_t`` (an ``M*M``-tuple) and ``b_t`` (an ``M``-tuple) for blocks ``hb``,
    zeros where ``t >= t1`` or past ``H`` (``mh`` false)."""
    ok = mh & (hb * 0 + t < t1)
    return (_load_entries(A, (t * H + hb) * (M * M), ok, M * M, VW),
            _load_entries(Bv, (t * H + hb) * M, ok, M, VWB))


@triton.jit
def _chunk_summary_thread(A, Bv, t0, t1, H, hb, mh, M: tl.constexpr, BH: tl.constexpr,
                          VW: tl.constexpr, VWB: tl.constexpr):
    """``(P, E)`` of steps ``t0 .. t1 - 1`` (rows of ``A (rows, H, M, M)``, ``Bv (rows, H, M)``)
    for blocks ``hb`` (``BH`` of them; ``mh``: those below ``H``), one block a lane:
    ``P = A_{t1-1} .. A_{t0}`` as an ``M*M``-tuple (row-major), the zero-start end state ``E`` as
    an ``M``-tuple. Also ``lookback_thread.py``'s first pass."""
    P, E = _identity_map(M, BH)
    # step t + 1's A and b are loaded before step t's FMAs (H100, m = 8: 0.387 ms forward against
    # 0.419 loading each step at the top of its trip, README.md "Thread summaries")
    a, bt = _load_step(A, Bv, t0, t1, H, hb, mh, M, VW, VWB)
    for t in tl.range(t0, t1):
        an, bn = _load_step(A, Bv, t + 1, t1, H, hb, mh, M, VW, VWB)
        P, E = _step(P, E, a, bt, M)
        a = an
        bt = bn
    return P, E


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_summary_thread_kernel(A, Bv, Pout, Eout, CU, T, H, CHUNK, NC,
                              M: tl.constexpr, BH: tl.constexpr, VW: tl.constexpr,
                              VWB: tl.constexpr, VARLEN: tl.constexpr):
    """``A`` rows ``(B*T, H, M, M)``, ``Bv`` rows ``(B*T, H, M)``; ``Pout (nseq, NC, H, M, M)``,
    ``Eout (nseq, NC, H, M)`` fp32. Grid ``(cdiv(H, BH), nseq, NC)``; one block per thread."""
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    hb = tl.program_id(0) * BH + tl.arange(0, BH)
    mh = hb < H
    MM: tl.constexpr = M * M
    P, E = _chunk_summary_thread(A, Bv, t0, t1, H, hb, mh, M, BH, VW, VWB)
    sc = s.to(tl.int64) * NC + c
    for k in tl.static_range(MM):
        tl.store(Pout + (sc * H + hb) * MM + k, P[k], mask=mh)
    for k in tl.static_range(M):
        tl.store(Eout + (sc * H + hb) * M + k, E[k], mask=mh)


def _vec_width(n: int) -> int:
    return 4 if n % 4 == 0 else 2 if n % 2 == 0 else 1


def launch_summary_thread(A, b, P, E, cu_arg, T, H, chunk, nc, nseq, m, varlen, tune):
    """Fill ``P (nseq, nc, H, m, m)`` and ``E (nseq, nc, H, m)`` (fp32) for chunks of ``chunk``
    steps, one block per thread; ``A (B, T, H, m, m)``, ``b (B, T, H, m)`` in any float dtype (read
    as fp32). ``TUNE['sumt_nw']``: warps a program (default 1: ``32 * sumt_nw`` blocks)."""
    if not 1 <= m <= THREAD_MAX_M:
        raise ValueError(f"TUNE['summary'] = 'thread' takes block sizes m <= {THREAD_MAX_M}, got m = {m}")
    nw = tune.get("sumt_nw", 1)
    if nw not in (1, 2, 4, 8):
        raise ValueError(f"TUNE['sumt_nw'] must be 1, 2, 4 or 8, got {nw!r}")
    bh = 32 * nw
    _bd_summary_thread_kernel[(cdiv(H, bh), nseq, nc)](
        A, b, P, E, cu_arg, T, H, chunk, nc, M=m, BH=bh, VW=_vec_width(m * m), VWB=_vec_width(m),
        VARLEN=varlen, num_warps=nw, num_stages=1)
