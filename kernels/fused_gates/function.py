"""Launchers and autograd Functions: ``fused_gate_scan`` (logits) and ``materialized_block_scan``
(a materialised ``A``, used as the benchmark baseline when ``kernels.block_diagonal`` is absent)."""
from __future__ import annotations

import torch
from torch import Tensor

from .._host import cdiv, max_seq_len
from ._common import (as_loaded, check_cu_seqlens, check_eps, check_float_tensor, check_state, empty,
                      next_pow2, num_sms, tune_knob, use_triton)
from .chunked import chunked_backward, chunked_forward
from .gate_math import variant_code
from .kernels import block_scan_bwd_kernel, block_scan_fwd_kernel
from .ref import block_scan_ref, fused_gate_scan_ref

__all__ = ["fused_gate_scan", "materialized_block_scan"]

MAX_M = 32


# Benchmark/test knobs (not public API): override "bh", "num_warps", "num_stages" (both passes;
# "bwd_bh", "bwd_num_warps", "bwd_num_stages" the backward's alone), "upcast16" (16-bit inputs
# read as fp32 copies, default on: see _common.as_loaded); the time-chunk rule's (choose_chunk):
# "chunk" (forced length, 0 = never), "chunk_below", "chunk_min_len", "chunk_max_m",
# "chunk_programs", "chunk_len"; the chunk summaries' "sum_bh", "sum_ncb", "sum_warps",
# "sum_dot", "sum_prec" (chunked.summary_config).
TUNE: dict = {}


def _config(num_seq: int, H: int, m: int, device, bwd: bool = False) -> tuple[int, int, int]:
    """(BH blocks per program, num_warps, pipeline stages): fill the GPU first, then widen tiles,
    but keep at least one warp's worth (32) of block elements ``BH * MP * MP`` a program.

    Measured on an H200 (B=8, T=2048, N=768, fp32; BH in {1 … 16} x stages in {3 … 12}): one
    warp, 5 stages, and enough programs for ~4 per SM were best at m = 4, 8 and 16. At m = 2 the
    fill rule chose BH = 4 (16 elements, half a warp): BH = 8 ran the forward in 0.222 ms
    against 0.529 and fwd+bwd in 0.64 against 1.36 ms (2026-11-30, benchmarks/RESULTS.md). With
    few sequences the floor also wins: B1 T16384 N768 fwd+bwd m = 2 4.77 ms (8 blocks) against
    10.86 (1 block, the old rule), m = 4 5.01 (2 blocks) against 6.99.
    """
    mp = max(2, next_pow2(m))
    bh = max(1, min(next_pow2(H), 256 // (mp * mp)))
    while bh > 1 and bh * mp * mp > 32 and num_seq * -(-H // bh) < 4 * num_sms(device):
        bh //= 2
    bh = tune_knob(TUNE, "bh", bwd, bh)
    elems = bh * mp * mp
    warps = tune_knob(TUNE, "num_warps", bwd, 1 if elems <= 64 else 2 if elems <= 256 else 4)
    return bh, warps, tune_knob(TUNE, "num_stages", bwd, 5)


# The unfused path's lines by MP = next_pow2(m): (fewest steps with a backward, fewest steps for a
# forward alone, fused programs an SM below which). Steps: below them the fused kernel's chain
# costs less than the unfused path's extra host work in eager calls (1.0-1.8 ms a fwd+bwd, about
# 0.17-0.28 ms a forward: torch's gate ops and backward, the chunked plan's launches;
# tools/host_overhead.py --bdlru unfused). H200 eager timings through bdlru_scan, fused against
# unfused, ms (2026-11-30, RESULTS.md "forty-fifth"). fwd+bwd: m = 4 B1 T4096 1.26 / 1.84, T6144
# 1.88 / 1.65-1.69; m = 8 B1 T2048 1.31 / 1.50, T4096 2.61 / 1.70-2.02; m = 16 B1 T1024 1.61 /
# 1.77, T2048 3.21 / 1.37-1.53; m = 32 B1 T128 0.55 / 0.94, T256 1.09 / 1.08-1.15 (a tie).
# Forward: m = 2 T2048 0.226 / 0.235, T4096 0.449 / 0.249; m = 4 T1024 0.155 / 0.208, T2048
# 0.304 / 0.180; m = 8 T512 0.108 / 0.151, T1024 0.212 / 0.183; m = 16 T256 0.178 / 0.159;
# m = 32 T64 0.140 / 0.166, T128 0.271 / 0.131. The host's share moves between machines (a later
# call: m = 4 forward T1024 0.168 / 0.407, T2048 0.304 / 0.363), so each line sits where the
# unfused path won by about 1.4x or more: m = 2 / 4 fwd+bwd from 8192 steps (m = 4 T8192 2.50 /
# 1.53-1.69), forward m = 4 from 4096 (0.602 / 0.348), m = 8 from 2048, m = 16 from 512 (0.352 /
# 0.215), m = 32 from 256 (0.532 / 0.137). Programs: m = 16 B3 T2048 (1.09 an SM) 3.35 /
# 2.82, B4 T4096 (1.45) 6.69 / 6.99; m = 32 B8 T2048 (1.45) 14.34 / 10.88, B11 (2.0) 14.34 / 14.71.
# None: never. Since the time-chunked fused passes (choose_chunk, forty-sixth session) the fused
# kernel wins with a backward at m <= 8 and m = 2 forwards (H200, CUDA graphs, chunked / unfused,
# ms: fwd+bwd m = 2 B1 T16384 0.48 / 1.17, m = 4 B2 T8192 1.08 / 2.06, m = 8 B2 T8192 2.94 / 3.92;
# eager m = 4 B1 T16384 1.10 / 2.09, m = 8 B1 T4096 0.82 / 1.55; forward m = 2 T16384 0.23 /
# 0.35 but T4096 0.115 / 0.102); long forwards at m = 4 / 8 stay unfused (m = 4 B2 T8192 0.71 /
# 0.66, m = 8 B1 T16384 1.70 / 1.47: its look-back forwards beat three chunked passes), from
# 4096 steps at m = 8 (eager forward T2048 0.233 chunked / 0.289 unfused, T8192 0.880 / 0.765).
UNFUSED_LINES = {2: (None, None, 1.5), 4: (None, 4096, 1.5), 8: (None, 4096, 1.5),
                 16: (2048, 512, 1.25), 32: (512, 256, 1.5)}


def unfused_faster(num_seq: int, max_len: int, H: int, m: int, device, backward: bool = True) -> bool:
    """Whether ``bdlru_scan(method="auto")`` should take the unfused path (torch gates, then the
    block-diagonal scan, which splits time into chunks when programs are few) over this kernel,
    which runs each sequence's chain in one program or, for a few long sequences at m <= 16, in
    time chunks (``choose_chunk``): m = 2..32, at least ``UNFUSED_LINES[MP][0]`` steps (``[1]``
    when no backward will run, ``backward=False``; None: never) and fewer than
    ``UNFUSED_LINES[MP][2]`` fused programs an SM (``_config``), and with a backward only where
    the fused call would not be time-chunked.

    Measured on an H200, fp32, fused against unfused (RESULTS.md "forty-fourth", "forty-fifth").
    CUDA graphs, fwd+bwd, ms: B1 T16384 N768 (0.4-0.7 programs an SM) 5.01 / 10.42 / 25.64
    against 2.06 / 3.92 / 7.00 at m = 4 / 8 / 16; at 1.45 programs an SM (T2048 / T4096) m = 2
    0.605 / 0.599, m = 4 0.634 / 0.594, m = 8 1.31 / 1.08, m = 16 6.71 / 7.00, m = 32 14.39 /
    10.86; at 2.2-2.9 m = 2 0.612 / 0.870, m = 4 1.27 / 1.55, m = 8 2.63 / 3.21, m = 32 equal
    within 2 %. Eager calls, which pay the unfused path's host time, set the step lines.
    ``TUNE['unfused_min_len']`` (both step lines) / ``TUNE['unfused_below']`` move the lines."""
    if not 2 <= m <= 32:
        return False
    min_len, min_len_fwd, below = UNFUSED_LINES[max(2, next_pow2(m))]
    line = TUNE.get("unfused_min_len", min_len if backward else min_len_fwd)
    if line is None or max_len < line:
        return False
    if backward and choose_chunk(None, num_seq, max_len, H, m, device) is not None:
        return False  # the chunked fused passes won with a backward (m = 16: 4.30 / 6.99 ms)
    programs = num_seq * cdiv(H, _config(num_seq, H, m, device)[0])
    return programs < TUNE.get("unfused_below", below) * num_sms(device)


def choose_chunk(cu_seqlens, B: int, T: int, H: int, m: int, device) -> int | None:
    """Chunk length of the time-chunked passes (``chunked.py``), or None for one program per
    sequence and head group. Chunked: fixed-length batches (no ``cu_seqlens``: sizing the chunk
    grid of a varlen batch needs its longest sequence, a device sync) at m = 2..``chunk_max_m``
    (16) with at least ``chunk_min_len`` steps (2048 at m = 5..8, else 4096) and fewer unchunked
    programs an SM than ``chunk_below`` (2; 1.25 from m = 9, where it replaces the unfused route:
    ``UNFUSED_LINES``); chunks of 128 steps while that makes at most ``chunk_programs`` (8192)
    programs, else ``chunk_len`` (256). ``TUNE["chunk"]`` forces a length (0: never), at any m
    and with ``cu_seqlens`` too.

    H200, fp32, N768, CUDA graphs, fwd+bwd / forward in ms, unchunked against chunked (best of
    128 / 256 / 512 steps; RESULTS.md "forty-sixth"): m = 2 B1 T16384 (0.36 programs an SM)
    4.45 / 0.48, B4 T8192 (1.45) 2.25 / 0.91, forward 0.90 / 0.44; m = 4 B1 T2048 0.63 / 0.24,
    B2 T8192 (1.45) 2.52 / 1.08, B4 T8192 (2.9) 2.54 / 2.12 but forward 1.21 / 1.40; m = 8 B2
    T8192 (1.45) 5.24 / 2.94, forward 1.67 / 1.70, B4 (2.9) 5.28 / 5.79. Chunk length: m = 4 B1
    T8192 (6144 programs at 128 steps) 0.56 at 128 / 0.74 at 256, T16384 (12288) 1.15 / 1.09.
    m = 16 (``tl.dot`` summaries), B1, one-pass / chunked / unfused: T4096 6.42 / 1.16 / 1.83,
    T16384 25.6 / 4.30 / 6.99. m = 32 lost to the unfused path (T2048 2.12 / 1.70, T16384 16.0
    / 12.3). Eager calls pay the passes' launches (about 0.5 ms of host time a fwd+bwd,
    ``tools/host_overhead.py``): m = 2 B1 T2048 fwd+bwd eager 0.87 chunked against 0.56 (GPU
    0.17 / 0.56), m = 4 0.69-0.89 / 0.63 (GPU 0.24 / 0.63), hence 4096 steps there (T4096
    eager: m = 2 0.70-0.80 / 1.12, m = 4 0.62-0.66 / 1.26); m = 8 0.75 / 1.31 at T2048; m = 16
    was timed from 4096 steps only."""
    if "chunk" in TUNE:
        c = int(TUNE["chunk"])
        return c if 0 < c < max(T, 1) or (c > 0 and cu_seqlens is not None) else None
    if cu_seqlens is not None or not 2 <= m <= TUNE.get("chunk_max_m", 16):
        return None
    if T < TUNE.get("chunk_min_len", 2048 if 5 <= m <= 8 else 4096):
        return None
    programs = B * cdiv(H, _config(B, H, m, device)[0])
    if programs >= TUNE.get("chunk_below", 2.0 if m <= 8 else 1.25) * num_sms(device):
        return None
    chunk = 128 if programs * cdiv(T, 128) <= TUNE.get("chunk_programs", 8192) else TUNE.get("chunk_len", 256)
    return chunk if chunk < T else None


def _launch_fwd(z, v, h0, cu, T, H, m, col0, code, eps, out_fp32_final, out_dtype, chunk=None):
    """``(h, h_final | None)``, or with ``chunk`` (steps, logits only: ``col0 == 1``)
    ``(h, h_final | None, PT)`` by the time-chunked passes of ``chunked.py`` (``PT``: what the
    chunked backward needs of the forward, ``chunked_forward``)."""
    num_seq = cu.numel() - 1 if cu is not None else v.shape[0]
    z, v = _as_loaded(z), _as_loaded(v)
    if chunk is not None:
        nc = cdiv(max_seq_len(T, cu), chunk)
        return chunked_forward(_launch_fwd, _config, block_scan_fwd_kernel, z, v, h0, cu, T, H, m,
                               code, eps, chunk, nc, out_fp32_final, out_dtype, TUNE, empty)
    h = empty(v.shape, out_dtype, v.device)
    hf = empty((num_seq, H, m), torch.float32, v.device) if out_fp32_final else None
    bh, warps, stages = _config(num_seq, H, m, v.device)
    grid = (num_seq, cdiv(H, bh))
    block_scan_fwd_kernel[grid](z, v, h0 if h0 is not None else h, h, hf if hf is not None else h,
                                cu if cu is not None else h, h, T, H, 0, eps,
                                M=m, MP=max(2, next_pow2(m)), BH=bh, COL0=col0, VARIANT=code,
                                NS=stages, HAS_H0=h0 is not None, STORE_HF=hf is not None,
                                IS_VARLEN=cu is not None, CHUNKED=False, num_warps=warps,
                                num_stages=stages)
    return h, hf


def _launch_bwd(z, v, h0, h, dh, dhf, cu, T, H, m, col0, code, eps, need_dh0, chunk=None, PT=None):
    """``(dz, dv, dh0 | None)``; with ``chunk`` the chunked passes, given the forward's ``PT``."""
    num_seq = cu.numel() - 1 if cu is not None else v.shape[0]
    dz = empty(z.shape, z.dtype, z.device)          # gradients in the inputs' dtypes
    dv = empty(v.shape, v.dtype, v.device)
    z, v, h, dh = _as_loaded(z), _as_loaded(v), _as_loaded(h), _as_loaded(dh)
    if chunk is not None:
        dh0 = chunked_backward(_launch_fwd, _config, block_scan_bwd_kernel, z, v, h0, h, dh, dhf, PT,
                               cu, T, H, m, code, eps, chunk, need_dh0, dz, dv, empty)
        return dz, dv, dh0
    dh0 = empty((num_seq, H, m), torch.float32, v.device) if need_dh0 else None
    bh, warps, stages = _config(num_seq, H, m, v.device, bwd=True)
    grid = (num_seq, cdiv(H, bh))
    block_scan_bwd_kernel[grid](z, v, h0 if h0 is not None else h, h, dh,
                                dhf if dhf is not None else dh, dz, dv,
                                dh0 if dh0 is not None else dv, cu if cu is not None else h, h,
                                T, H, 0, eps, M=m, MP=max(2, next_pow2(m)), BH=bh, COL0=col0,
                                VARIANT=code, NS=stages, HAS_H0=h0 is not None,
                                HAS_DHF=dhf is not None, STORE_DH0=dh0 is not None, IS_VARLEN=cu is not None,
                                num_warps=warps, num_stages=stages)
    return dz, dv, dh0


def _as_loaded(x: Tensor) -> Tensor:
    return as_loaded(x, TUNE.get("upcast16", True))


class _BlockScanFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, v, h0, cu, col0, code, eps, output_final_state, out_dtype, chunk):
        B, T, H, m = v.shape
        z, v = z.contiguous(), v.contiguous()
        h0c = h0.float().contiguous() if h0 is not None else None
        out = _launch_fwd(z, v, h0c, cu, T, H, m, col0, code, eps, output_final_state, out_dtype, chunk)
        h, hf = out[0], out[1]
        ctx.save_for_backward(z, v, h0c, h, cu, out[2] if chunk is not None else None)
        ctx.cfg = (T, H, m, col0, code, eps, h0 is not None and h0.requires_grad,
                   h0.dtype if h0 is not None else None, chunk)
        return h, hf

    @staticmethod
    def backward(ctx, dh, dhf):
        z, v, h0, h, cu, PT = ctx.saved_tensors
        T, H, m, col0, code, eps, need_dh0, h0_dtype, chunk = ctx.cfg
        dh = dh.contiguous() if dh is not None else torch.zeros_like(h)
        dhf = dhf.float().contiguous() if dhf is not None else None
        dz, dv, dh0 = _launch_bwd(z, v, h0, h, dh, dhf, cu, T, H, m, col0, code, eps, need_dh0,
                                  chunk, PT)
        if dh0 is not None:
            dh0 = dh0.to(h0_dtype)
        return dz, dv, dh0, None, None, None, None, None, None, None


def _check_common(v, initial_state, cu_seqlens, B, T, H, m):
    num_seq = check_cu_seqlens(cu_seqlens, B, T, v.device)
    check_state("initial_state", initial_state, (num_seq, H, m), v.device)
    if not 1 <= m <= MAX_M:
        raise ValueError(f"block size m must be in 1..{MAX_M}, got {m}")


def fused_gate_scan(logits: Tensor, v: Tensor, variant: str = "softmax", eps: float = 1e-6,
                    initial_state: Tensor | None = None, output_final_state: bool = False,
                    cu_seqlens: Tensor | None = None):
    """BD-LRU scan with gates normalised in registers.

    ``(A_t, a0_t) = normalize_gates(logits_t, variant, eps)``, ``h_t = A_t h_{t-1} + a0_t ⊙ v_t``.

    Args:
        logits: ``(B, T, H, m, m+1)``; ``[..., 0]`` input gate, ``[..., 1:]`` row of ``A``.
        v: ``(B, T, H, m)``.
        variant: a gate variant of :mod:`lrnn_scan.gates` (softmax, sigmoid, relu, tanh,
            identity, none, or an alias).
        initial_state: ``(B | num_seqs, H, m)`` (fp32 recommended), default zeros.
        output_final_state: also return the fp32 final state ``(B | num_seqs, H, m)``.
        cu_seqlens: int64 ``(num_seqs + 1,)`` packed-sequence offsets (``B == 1``).

    Returns:
        ``(h, h_final or None)``, ``h`` of shape ``(B, T, H, m)`` in ``result_type(logits, v)``.
    """
    check_float_tensor("logits", logits, 5, "(B, T, H, m, m+1)")
    check_float_tensor("v", v, 4, "(B, T, H, m)")
    B, T, H, m = v.shape
    if tuple(logits.shape) != (B, T, H, m, m + 1):
        raise ValueError(f"logits must have shape (B, T, H, m, m+1) = {(B, T, H, m, m + 1)} to "
                         f"match v {tuple(v.shape)}, got {tuple(logits.shape)}")
    if logits.device != v.device:
        raise ValueError(f"logits and v must be on one device, got {logits.device} and {v.device}")
    eps = check_eps(eps)
    code = variant_code(variant)
    _check_common(v, initial_state, cu_seqlens, B, T, H, m)
    out_dtype = torch.promote_types(logits.dtype, v.dtype)
    if not use_triton(v, block_scan_fwd_kernel):
        h, hf = fused_gate_scan_ref(logits, v, variant, eps, initial_state, output_final_state,
                                    cu_seqlens, dtype=torch.float32)
        return h, hf
    chunk = choose_chunk(cu_seqlens, B, T, H, m, v.device)
    if chunk is not None and cu_seqlens is not None and max_seq_len(T, cu_seqlens) <= chunk:
        chunk = None  # (forced chunks only) every sequence fits one chunk: nothing to split
    h, hf = _BlockScanFn.apply(logits, v, initial_state, cu_seqlens, 1, code, eps,
                               bool(output_final_state), out_dtype, chunk)
    return h, (hf if output_final_state else None)


def materialized_block_scan(A: Tensor, b: Tensor, initial_state: Tensor | None = None,
                            output_final_state: bool = False, cu_seqlens: Tensor | None = None):
    """``h_t = A_t h_{t-1} + b_t`` over a materialised ``A (B,T,H,m,m)`` with the same kernels
    (``COL0 = 0``, no gate). A baseline for the benchmark; the library's own materialised-A
    scan is ``kernels.block_diagonal.block_diagonal_scan``."""
    check_float_tensor("A", A, 5, "(B, T, H, m, m)")
    check_float_tensor("b", b, 4, "(B, T, H, m)")
    B, T, H, m = b.shape
    if tuple(A.shape) != (B, T, H, m, m):
        raise ValueError(f"A must have shape {(B, T, H, m, m)}, got {tuple(A.shape)}")
    _check_common(b, initial_state, cu_seqlens, B, T, H, m)
    out_dtype = torch.promote_types(A.dtype, b.dtype)
    if not use_triton(b, block_scan_fwd_kernel):
        return block_scan_ref(A, b, initial_state, output_final_state, cu_seqlens, torch.float32)
    h, hf = _BlockScanFn.apply(A, b, initial_state, cu_seqlens, 0, 5, 1.0,
                               bool(output_final_state), out_dtype, None)
    return h, (hf if output_final_state else None)
