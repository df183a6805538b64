"""Chunk summaries on tensor cores: per chunk the product ``P = A_{t1-1} ... A_{t0}`` of the
transitions and the local end state ``E`` (zero start), reading ``A`` once.

Why: the time-chunked forward (``scan._bd_forward``) needs ``P``, ``m^3`` multiply-adds per block
and step. The ring summary (``_bd_fwd_ring`` with ``SUMMARY``) gives each of the ``m + 1`` columns
of ``[P | E]`` its own program, so it reads ``A`` ``m + 1`` times; the matrix-state kernel
(``_bd_summary_kernel``) does the ``m^3`` work as broadcast-and-sum on the CUDA cores. Both made
chunking lose to one pass from ``m = 16`` on (``scan._choose_chunk``). Here ``S <- A_t S`` is a
``tl.dot`` per step, so the product runs on tensor cores and ``A`` is read once.

Layout: a tile is a ``D x D`` block-diagonal matrix holding ``G = D / MP`` consecutive blocks
(``D = max(16, MP)``: ``tl.dot`` needs 16 rows at least, so ``m <= 8`` packs ``16 / MP`` blocks
per tile and multiplies zeros off the diagonal). Products of block-diagonal tiles stay
block-diagonal, and the masked loads and stores touch the diagonal blocks only. A program owns
``NT`` tiles of one sequence and one chunk; ``E`` is a mat-vec on the CUDA cores beside the dot.

Precision: ``PREC`` is ``tl.dot``'s ``input_precision``. ``"tf32x3"`` (the default for D = 16) splits each
fp32 operand into a tf32 head and tail and keeps three of the four products, about fp32 accuracy
at a third of tf32's rate; ``"ieee"`` (the default for D = 32, where it measured faster) is plain
fp32 FMA (no tensor cores); ``"tf32"`` is 10-bit
mantissas (errors ~1e-3, not for fp32 tests).

``launch_summary`` picks between the three summary kernels for the chunked forward.
"""
import triton
import triton.language as tl

from .._host import cdiv, next_pow2
from .fwd import _bd_fwd_ring, _bd_summary_kernel, _seq_bounds
from .summary_thread import THREAD_MAX_M, launch_summary_thread

__all__ = ["summary_dot_cfg", "launch_summary_dot", "launch_summary", "summary_kind", "default_chunk",
           "rerun_factor"]


@triton.jit
def _tile_dot(x, y, D: tl.constexpr, NT: tl.constexpr, PREC: tl.constexpr):
    """``x @ y`` for ``NT`` tiles ``(NT, D, D)`` (a 2-D dot for one tile: the 3-D form needs a
    batch dimension Triton can lay out)."""
    if NT == 1:
        return tl.reshape(tl.dot(tl.reshape(x, (D, D)), tl.reshape(y, (D, D)), input_precision=PREC),
                          (NT, D, D))
    else:
        return tl.dot(x, y, input_precision=PREC)


@triton.jit
def _tile_layout(group, H, M: tl.constexpr, MP: tl.constexpr, D: tl.constexpr, NT: tl.constexpr):
    """Block group ``group`` (``NT`` tiles of ``D // MP`` blocks): ``(mrow (NT, D), mask_a
    (NT, D, D), offs_a, offs_s)``, the masks and element offsets of its rows of ``b``/``h`` and of
    its diagonal blocks of ``A`` within one time row."""
    r = tl.arange(0, D)
    i = r % MP  # row (column) inside its block
    tt = tl.arange(0, NT)
    hb = (group * NT + tt)[:, None] * (D // MP) + (r // MP)[None, :]  # (NT, D) block of row r
    mrow = (hb < H) & (i < M)[None, :]
    same = (r // MP)[:, None] == (r // MP)[None, :]  # diagonal blocks of a tile
    mask_a = mrow[:, :, None] & (same & (i < M)[None, :])[None, :, :]
    offs_a = hb[:, :, None] * (M * M) + (i * M)[None, :, None] + i[None, None, :]
    offs_s = hb * M + i[None, :]
    return mrow, mask_a, offs_a, offs_s


@triton.jit
def _chunk_summary(A, Bv, t0, t1, HM, HMM, mrow, mask_a, offs_a, offs_s,
                   D: tl.constexpr, NT: tl.constexpr, PREC: tl.constexpr, NS: tl.constexpr):
    """``(P, E)`` of steps ``[t0, t1)``: ``P <- A_t P`` from ``I`` (tensor cores), ``E <- A_t E +
    b_t`` from 0 (a mat-vec beside it), ``A`` read once."""
    r = tl.arange(0, D)
    S = tl.zeros([NT, D, D], dtype=tl.float32) + (r[:, None] == r[None, :]).to(tl.float32)[None, :, :]
    e = tl.zeros([NT, D], dtype=tl.float32)
    for t in tl.range(t0, t1, num_stages=NS):
        a = tl.load(A + t * HMM + offs_a, mask=mask_a, other=0.0).to(tl.float32)
        bt = tl.load(Bv + t * HM + offs_s, mask=mrow, other=0.0).to(tl.float32)
        e = tl.sum(a * e[:, None, :], axis=2) + bt
        S = _tile_dot(a, S, D, NT, PREC)
    return S, e


@triton.jit(do_not_specialize=["T", "CHUNK", "NC"])
def _bd_summary_dot_kernel(A, Bv, Pout, Eout, CU, T, H, CHUNK, NC,
                           M: tl.constexpr, MP: tl.constexpr, D: tl.constexpr, NT: tl.constexpr,
                           PREC: tl.constexpr, NS: tl.constexpr, VARLEN: tl.constexpr):
    """``A`` rows ``(B*T, H, M, M)``, ``Bv`` rows ``(B*T, H, M)``; ``Pout (nseq, NC, H, M, M)`` and
    ``Eout (nseq, NC, H, M)`` fp32. Grid ``(cdiv(H, NT * D // MP), nseq, NC)``."""
    s = tl.program_id(1)
    c = tl.program_id(2)
    bos, eos, t0, t1 = _seq_bounds(CU, s, c, T, CHUNK, VARLEN)
    mrow, mask_a, offs_a, offs_s = _tile_layout(tl.program_id(0), H, M, MP, D, NT)
    HM = H * M
    HMM = HM * M
    S, e = _chunk_summary(A, Bv, t0, t1, HM, HMM, mrow, mask_a, offs_a, offs_s, D, NT, PREC, NS)
    sc = s.to(tl.int64) * NC + c
    tl.store(Pout + sc * HMM + offs_a, S, mask=mask_a)
    tl.store(Eout + sc * HM + offs_s, e, mask=mrow)


def summary_stages(tune, default):
    """Software-pipeline depth of the summary loop (``TUNE['sum_ns']``, else ``default``): the
    loop's loads in flight per program are ``sum_ns - 1`` time steps' tiles."""
    ns = tune.get("sum_ns", default)
    if not isinstance(ns, int) or not 1 <= ns <= 16:
        raise ValueError(f"TUNE['sum_ns'] must be an int in [1, 16], got {ns!r}")
    return ns


def summary_dot_cfg(m, tune):
    """``(D, NT, PREC, num_warps)`` from ``TUNE`` keys ``sum_nt`` (tiles per program, default 1),
    ``sum_prec`` (``"tf32x3"`` on 16 x 16 tiles, ``"ieee"`` on 32 x 32) and ``sum_nw`` (1 warp per
    16 x 16 tile, at most 4)."""
    mp = next_pow2(m)
    d = max(16, mp)
    nt = tune.get("sum_nt", 1)
    if nt < 1 or nt & (nt - 1):
        raise ValueError(f"TUNE['sum_nt'] must be a power of two, got {nt}")
    # H100, B1 T16384 N768, forward in 256-step chunks: m = 16 tf32x3 0.685 ms, ieee 0.868;
    # m = 32 tf32x3 2.679, ieee 1.778 (tf32x3's three dots per step on 32 x 32 tiles cost more)
    prec = tune.get("sum_prec", "tf32x3" if d == 16 else "ieee")
    if prec not in ("tf32x3", "ieee", "tf32"):
        raise ValueError(f"TUNE['sum_prec'] must be 'tf32x3', 'ieee' or 'tf32', got {prec!r}")
    nw = tune.get("sum_nw", max(1, min(4, nt * d * d // 256)))
    return d, nt, prec, nw


def launch_summary_dot(A, b, P, E, cu_arg, T, H, chunk, nc, nseq, m, ns, varlen, tune):
    """Fill ``P (nseq, nc, H, m, m)`` and ``E (nseq, nc, H, m)`` (fp32) for chunks of ``chunk``
    steps; ``A (B, T, H, m, m)``, ``b (B, T, H, m)`` in any float dtype (read as fp32)."""
    d, nt, prec, nw = summary_dot_cfg(m, tune)
    ns = summary_stages(tune, ns)
    per_prog = nt * (d // next_pow2(m))  # blocks per program
    _bd_summary_dot_kernel[(cdiv(H, per_prog), nseq, nc)](
        A, b, P, E, cu_arg, T, H, chunk, nc, M=m, MP=next_pow2(m), D=d, NT=nt, PREC=prec, NS=ns,
        VARLEN=varlen, num_warps=nw, num_stages=ns)


def summary_kind(m, tune, chunk):
    """The chunk-summary kernel of ``launch_summary`` for block size ``m`` and ``chunk``-step
    chunks: ``TUNE['summary']``, else ``thread`` at ``m = 5..8`` and at ``m = 4`` in chunks of at
    most ``M4_THREAD_CHUNK`` steps (``default_chunk`` picks those only where they win), ``dot``
    from 9 on, ``ring`` otherwise.

    H100, fp32, B1 T16384 N768, 256-step chunks, forward, ring vs dot: m = 2 0.327 vs 0.748 ms,
    4 0.261 vs 0.473 (tiles mostly zeros), 8 0.581 vs 0.556, 16 2.197 vs 0.685, 32 8.707 vs 1.778.
    Sixty-seventh session (H100, same shape, CUDA graphs; the thread summaries in 128-step chunks,
    ``scan._choose_chunk``): forward m = 8 0.387 ms against dot's 0.543, m = 6 0.308 against
    0.719, fwd+bwd 0.914 / 1.057 and 1.203 / 1.596. m = 4: ``default_chunk``."""
    default = ("thread" if 5 <= m <= THREAD_MAX_M or (m == 4 and chunk <= M4_THREAD_CHUNK)
               else "dot" if m > THREAD_MAX_M else "ring")
    kind = tune.get("summary", default)
    if kind not in ("ring", "v1", "dot", "thread"):
        raise ValueError(f"TUNE['summary'] must be 'ring', 'v1', 'dot' or 'thread', got {kind!r}")
    return kind


M4_THREAD_CHUNK = 64  # m = 4: the thread summaries' chunk length (default_chunk)
M4_THREAD_PER_SM = 8  # ... where they make at least this many programs an SM


def default_chunk(m, tune, ring_programs, max_len, nsm):
    """The chunked forward's default chunk length (``scan._choose_chunk``; ``ring_programs``: the
    ring kernels' programs, 8 blocks each at ``m = 4``): 128 where the thread summaries run at
    ``m = 5..8``; at ``m = 4`` ``M4_THREAD_CHUNK`` (64, thread summaries) where their grid (32
    blocks x 64 steps a program) makes ``M4_THREAD_PER_SM`` programs an SM, else 256 (ring).

    m = 4, H100, fp32, CUDA-graph medians of 3 rounds, ms, ring summaries in 256-step chunks /
    thread summaries in 64 / in 128 (sixty-eighth session, RESULTS.md), forward: B1 N768 T16384
    (11.6 thread programs an SM at 64 steps) 0.2308 / **0.2127** / 0.2204, T65536 (46.5)
    0.8702 / **0.8277** / 0.7854, T4096 (2.9) **0.0669** / 0.0803 / 0.1111, B1 N384 T16384 (5.8)
    **0.1193** / 0.1279 / 0.1472; fwd+bwd (ring / thread 64): B1 N768 T16384 0.5415 / 0.5407,
    B2 T16384 (23) 1.1138 / **1.0224**, B1 T4096 **0.1697** / 0.1731."""
    if m == 4 and tune.get("summary", "thread") == "thread":
        thread_programs = cdiv(ring_programs, 4) * cdiv(max_len, M4_THREAD_CHUNK)
        if thread_programs >= M4_THREAD_PER_SM * nsm:
            return M4_THREAD_CHUNK
    return 128 if m > 1 and summary_kind(m, tune, 128) == "thread" else 256


RERUN_LEN = 0  # the re-run's chunk length where the summaries' are shorter (rerun_factor; 0: off)
RERUN_PER_SM = 8  # ... as long as the re-run keeps this many programs an SM


def rerun_factor(chunk, nc, ring_programs, nsm, tune):
    """How many summary chunks (``chunk`` steps, ``nc`` a sequence) one program of the chunked
    forward's re-run covers (``scan._bd_forward``; ``ring_programs``: the ring kernel's block
    groups times sequences): the re-run's carries are those of every ``k``-th chunk, so it may run
    longer chunks than the summaries, which want short ones (``default_chunk``). ``k`` brings the
    re-run to ``TUNE['rerun_len']`` steps (default ``RERUN_LEN``: 0, the summaries' chunks) while it
    keeps ``RERUN_PER_SM`` programs an SM. Why: the ring re-run's cost per chunk (the pipeline's
    start) weighs on 64- and 128-step chunks; H100 B1 T16384 N768 (sixty-seventh session, in
    runs whose summaries had the same chunks): the carry pass and re-run at m = 4 in 64- /
    256-step chunks 115 / 105 us, at m = 8 in 128 / 512 179 / 173 us. An opt-in, not timed
    as such yet (sixty-eighth session: no GPU; ``tools/gpu_owed.sh rerun``)."""
    length = tune.get("rerun_len", RERUN_LEN)
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"TUNE['rerun_len'] must be a step count >= 0 (0: off), got {length!r}")
    k = max(1, length // chunk)
    while k > 1 and ring_programs * cdiv(nc, k) < RERUN_PER_SM * nsm:
        k //= 2
    return k


def launch_summary(A, b, P, E, cu_arg, T, H, chunk, nc, nseq, m, bh, nw, ns, varlen, tune, fwd_variant):
    """Chunk summaries ``P`` (product of the chunk's transitions) and ``E`` (its end state from 0)
    for ``scan._bd_forward``, by ``summary_kind``: ``ring`` (default below m = 4, and at m = 4 in
    long chunks): ``_bd_fwd_ring`` with one column of ``[P | E]`` per program (``fwd_variant``
    picks its ring); ``v1``: the matrix-state kernel ``_bd_summary_kernel``; ``dot`` (default from
    m = 9 on): ``launch_summary_dot`` (``S <- A_t S`` on tensor cores, ``A`` read once); ``thread``
    (m <= 8, default at m = 5..8 and at m = 4 in short chunks): ``summary_thread.py``, one block's
    ``(P, E)`` in one thread's registers."""
    mp = next_pow2(m)
    kind = summary_kind(m, tune, chunk)
    if kind == "thread":
        launch_summary_thread(A, b, P, E, cu_arg, T, H, chunk, nc, nseq, m, varlen, tune)
        return
    if kind == "dot":
        launch_summary_dot(A, b, P, E, cu_arg, T, H, chunk, nc, nseq, m, ns, varlen, tune)
        return
    if kind == "ring":
        R = int(fwd_variant[4:]) if fwd_variant.startswith("ring") else 2
        _bd_fwd_ring[(cdiv(H, bh) * (m + 1), nseq, nc)](
            A, b, b, b, E, P, cu_arg, T, H, chunk, nc, M=m, MP=mp, BH=bh, R=R, SUMMARY=True,
            HAS_INIT=False, STORE_H=False, STORE_FINAL=True, VARLEN=varlen, num_warps=nw)
        return
    ncb = min(next_pow2(m + 1), 16)
    ngrp = cdiv(m + 1, ncb)
    bhs = max(1, 1024 // (mp * mp * ncb))
    nws = max(1, min(8, bhs * mp * mp * ncb // 1024))
    _bd_summary_kernel[(cdiv(H, bhs) * ngrp, nseq, nc)](
        A, b, P, E, cu_arg, T, H, chunk, nc, M=m, MP=mp, BH=bhs, NCB=ncb, NGRP=ngrp, NS=ns,
        VARLEN=varlen, num_warps=nws, num_stages=ns)
