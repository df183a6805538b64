"""Launchers and autograd Function for the companion scans (logits or materialised coefficients)."""
from __future__ import annotations

import torch
from torch import Tensor

from .._host import cdiv, max_seq_len
from ..fused_gates._common import (as_loaded, check_cu_seqlens, check_eps, check_float_tensor, check_state,
                                   empty, next_pow2, num_sms, tune_knob, use_triton)
from ..fused_gates.gate_math import variant_code
from ..fused_gates.function import _launch_fwd as fg_launch_fwd
from .chunked import chunked_backward, chunked_forward
from .kernels import UNROLL_MAX_M, companion_bwd_kernel, companion_fwd_kernel
from .ref import companion_scan_coeffs_ref, companion_scan_ref

__all__ = ["companion_scan", "companion_scan_coeffs"]

MAX_M = 64


# Benchmark/test knobs (not public API): override "bn", "num_warps", "num_stages" (both passes;
# "bwd_bn", "bwd_num_warps", "bwd_num_stages" the backward's alone), "upcast16" (16-bit inputs
# read as fp32 copies, default on: see fused_gates._common.as_loaded), "chunk" (time-chunk length,
# choose_chunk), "sum_bn", "sum_warps", "sum_unroll", "sum_stages" (chunked.summary_config),
# "unroll" / "bwd_unroll" (0 / 1: the one-pass loops' m steps a trip, _unrolled).
TUNE: dict = {}


def _unrolled(m: int, bwd: bool = False, logits: bool = False) -> bool:
    """Whether the one-pass loops run ``m`` steps a trip (``kernels.py``'s ``UNROLL``): up to
    ``UNROLL_MAX_M``, but the backward from logits only up to m = 8. Its 16-step body at
    m = 16 needs more than 255 registers (Triton 3.6, sm_90a: 320 bytes spilled at 16 channels a
    program): H200 B8 T2048 N768 fwd+bwd 4.10 ms unrolled, 1.93 one step a trip (forty-ninth
    session; m = 8 from logits keeps the unrolled loop: 1.41 against 3.02). ``TUNE["unroll"]``
    (``bwd_unroll`` the backward's) overrides up to ``UNROLL_MAX_M``."""
    default = m <= UNROLL_MAX_M.value and not (bwd and logits and m > 8)
    return bool(tune_knob(TUNE, "unroll", bwd, default)) and m <= UNROLL_MAX_M.value


def _config(num_seq: int, N: int, m: int, device, bwd: bool = False,
            logits: bool = False, chunked: bool = False) -> tuple[int, int, int, int]:
    """(BN channels per program, MP, num_warps, pipeline stages) of the forward or the backward;
    ``num_seq`` counts programs along time (sequences, or sequences x chunks with ``chunked``).

    Each program runs its channels' chains one step at a time, so the time is set by how many
    steps' loads are in flight: small tiles (many programs an SM) and deep pipelines. Measured
    on an H200 (2026-11-30, B=8, T=2048, N=768, fp32, BN in {8, 16, 32} x stages in {4 … 16};
    benchmarks/RESULTS.md, "forty-third"): the forward is fastest with 64 (m <= 4) or 128
    (m >= 8) elements ``BN * MP`` a program and 12 stages (m = 4: 0.196 -> 0.142 ms); the backward,
    which loads four tensors a step, with 32 (m <= 4) or 128 elements and 6 (m = 2), 5 (m = 3, 4)
    or 4 stages (m = 4 fwd+bwd 0.641 -> 0.437 ms with the forward's change), twice the elements
    above 16 programs an SM. Fewer than 32 elements (half a warp) lost 1.5-2.5x. The backward
    from logits (``logits``: the gate normalisation and its gradient each step) keeps 256
    elements at m >= 16 (m = 16 fwd+bwd 2.150 ms; 2.584 with 128 elements). Since the loops run
    m steps a trip (forty-eighth session, up to ``UNROLL_MAX_M``) the stages count trips, set from
    the steps in flight at m >= 3: about 40 forward, 32 backward, 16 in time chunks. The
    backward at m = 5..8 (forty-ninth, H200 fp32 N768 fwd+bwd ms): 64 elements (8 channels) and
    24 steps in flight, one pass and chunks, never doubled: coefficients B8 T2048 m = 8 0.710 ->
    0.648 (32 steps 0.679, 16 steps 0.773), m = 6 0.746 -> 0.659, N4096 m = 8 2.874 -> 2.712,
    logits m = 8 1.789 -> 1.417; 256-step chunks B1 T16384 m = 8 1.181 -> 0.975 (the doubled 32
    channels a program had cost 20 %), B2 T4096 0.504 -> 0.525.
    """
    mp = max(2, next_pow2(m))
    if bwd:
        if mp <= 4:
            elems, stages = 32, (6 if mp == 2 else 5)
        elif mp == 8:
            elems, stages = 64, 4
        else:
            elems, stages = (256 if logits and mp >= 16 else 128), 4
    else:
        elems, stages = (64 if mp <= 4 else 128), 12
    bn = max(8, elems // mp)
    while bn > 8 and bn * mp > 32 and num_seq * -(-N // bn) < num_sms(device):
        bn //= 2  # fill the GPU first (B1 T16384 N768 m = 4 logits fwd+bwd: 5.60 ms, old 8.65)
    if bwd and mp != 8 and num_seq * -(-N // bn) > 16 * num_sms(device):
        bn *= 2  # many programs: B8 N4096 m = 4 fwd+bwd 1.772 -> 1.571 ms (N1536: 8 kept, 0.690)
    bn = tune_knob(TUNE, "bn", bwd, bn)
    warps = tune_knob(TUNE, "num_warps", bwd, 1 if bn * mp <= 256 else 2 if bn * mp <= 1024 else 4)
    if _unrolled(m, bwd, logits):  # the loops run m steps a trip: stages count trips
        # steps in flight; H200 fp32 N768 fwd+bwd ms (forty-eighth): one pass B8 T2048 m = 8
        # 0.711 (16 steps: 1.02), m = 4 0.392 (12: 0.489); 256-step chunks, B1 T16384 (many
        # short programs, shallower is better): m = 8 1.187 at 16 steps, 1.22 at 32-40
        steps = (2 * stages if m <= 2 else 24 if bwd and mp == 8 else 16 if chunked
                 else 32 if bwd else 40)
        stages = max(2, -(-steps // m))
    return bn, mp, warps, tune_knob(TUNE, "num_stages", bwd, stages)


def choose_chunk(cu_seqlens, num_seq: int, T: int, N: int, m: int, device,
                 logits: bool = True) -> int | None:
    """Chunk length of the time-chunked passes (``chunked.py``), or None for the one-pass
    kernels. Chunked: fixed-length batches (no ``cu_seqlens``: the chunk grid of a varlen batch
    needs its longest sequence, a device sync) at m = 2..``chunk_max_m`` (8) with at least
    ``chunk_min_len`` steps (4096; 8192 for coefficients, ``logits=False``, at m <= 4) and fewer
    sequence-channels ``num_seq * N`` an SM than ``chunk_below`` (24, just above the largest
    measured wins: N4096 and other batch sizes were not timed);
    chunks of 128 steps at m = 2 or below ``chunk_steps`` (8192) sequence-steps ``num_seq * T``,
    else ``chunk_len`` (256). ``TUNE["chunk"]`` forces a length (0: never), at any m and with
    ``cu_seqlens`` too.

    One program runs its channels' chains step by step, so a few long sequences leave the GPU
    waiting on that chain. H200 (132 SMs), fp32, N768, fwd+bwd ms, one pass against chunked (128
    / 256 steps), benchmarks/RESULTS.md "forty-seventh". CUDA graphs: coefficients m = 2 B1
    T16384 2.41 / 0.30 / 0.30, B4 T4096 (23 sequence-channels an SM) 0.61 / 0.29 / 0.30, B8
    T2048 (47) 0.305 / 0.287 / 0.296; m = 4 B1 T2048 0.335 / 0.104 / 0.137, B2 T4096 0.68 /
    0.31 / 0.30, B4 T4096 0.70 / 0.60 / 0.59, B8 T2048 0.44 / 0.60 / 0.59; m = 8 B2 T4096 (12)
    1.26 / 0.78 / 0.67, B4 T4096 1.44 / 1.59 / 1.50; m = 16 B1 T4096 1.51 / 1.64 / 1.49, B2
    3.1 chunked against 1.55; logits m = 4 B1 T16384 5.34 / 0.92 / 0.94, B4 T4096 1.34 / 0.90 /
    0.94, B8 T2048 0.81 / 0.90 / 0.94. Eager calls pay the passes' launches (about 0.6 ms of
    host time a fwd+bwd), hence the step lines: B1 eager, one pass / chunked, logits m = 4
    T2048 0.67 / 0.77, T4096 1.34 / 0.76; m = 2 T4096 1.24 / 0.76; coefficients m = 8 T2048
    0.63 / 0.80, T4096 1.26 / 0.70; m = 4 T4096 0.67 / 0.82 (B2 0.68 / 0.80), m = 3 0.77 / 0.80,
    m = 2 T4096 0.61 / 0.81, T8192 1.21 / 0.74. Dense ``m x m`` blocks of the same recurrence
    (``block_diagonal_scan``): m = 4 B1 T16384 1.40, m = 8 4.26. Forty-eighth, with the summary
    pass unrolled (``chunked.summary_config``), one pass / 256-step chunks: coefficients m = 8
    B1 T16384 1.18 chunked, B2 T4096 1.26 / 0.51, B4 T4096 1.44 / 1.18 (now chunked), B8 T2048
    0.77 / 1.18; m = 4 B1 T16384 0.53, B4 T4096 0.70 / 0.52, B8 T2048 0.43 / 0.53; m = 16 B1
    T4096 1.51 / 2.03; logits m = 4 B1 T16384 0.80, m = 8 B2 T4096 2.50 / 0.80."""
    if "chunk" in TUNE:
        c = int(TUNE["chunk"])
        return c if 0 < c < max(T, 1) or (c > 0 and cu_seqlens is not None) else None
    if cu_seqlens is not None or not 2 <= m <= TUNE.get("chunk_max_m", 8):
        return None
    if T < TUNE.get("chunk_min_len", 8192 if m <= 4 and not logits else 4096):
        return None
    if num_seq * N >= TUNE.get("chunk_below", 24) * num_sms(device):
        return None
    chunk = 128 if m <= 2 or num_seq * T < TUNE.get("chunk_steps", 8192) else TUNE.get("chunk_len", 256)
    return chunk if chunk < T else None


class _CompanionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, v, h0, cu, col0, code, eps, output_final_state, out_dtype, chunk=None):
        B, T, N = v.shape
        m = z.shape[-1] - col0
        z, v = z.contiguous(), v.contiguous()
        h0c = h0.float().contiguous() if h0 is not None else None
        num_seq = cu.numel() - 1 if cu is not None else B
        up = TUNE.get("upcast16", True)
        PT = None
        nc = cdiv(max_seq_len(T, cu), chunk) if chunk is not None else 1
        if nc <= 1:  # (forced chunks) every sequence fits one chunk
            chunk = None
        else:
            cfg = _config(num_seq * nc, N, m, v.device, chunked=True)
            h, hf, PT = chunked_forward(fg_launch_fwd, companion_fwd_kernel, as_loaded(z, up),
                                        as_loaded(v, up), h0c, cu, T, N, m, col0, code, eps, chunk,
                                        nc, cfg, _unrolled(m), output_final_state, out_dtype, TUNE,
                                        empty)
        if chunk is None:
            h = empty(v.shape, out_dtype, v.device)
            hf = (empty((num_seq, N, m), torch.float32, v.device)
                  if output_final_state else None)
            bn, mp, warps, stages = _config(num_seq, N, m, v.device)
            companion_fwd_kernel[(num_seq, cdiv(N, bn))](
                as_loaded(z, up), as_loaded(v, up), h0c if h0c is not None else h, h,
                hf if hf is not None else h, cu if cu is not None else h, h, T, N, 0, eps, M=m, MP=mp,
                BN=bn, COL0=col0, VARIANT=code, NS=stages, HAS_H0=h0c is not None,
                STORE_HF=hf is not None, IS_VARLEN=cu is not None, UNROLL=_unrolled(m),
                num_warps=warps, num_stages=stages)
        ctx.save_for_backward(z, v, h0c, h, cu, PT)
        ctx.cfg = (col0, code, eps, h0 is not None and h0.requires_grad,
                   h0.dtype if h0 is not None else None, chunk)
        return h, hf

    @staticmethod
    def backward(ctx, dh, dhf):
        z, v, h0, h, cu, *pt = ctx.saved_tensors   # pt: [P^T of the chunks] (None: one pass)
        col0, code, eps, need_dh0, h0_dtype, *chunk = ctx.cfg
        chunk = chunk[0] if chunk else None
        B, T, N = v.shape
        m = z.shape[-1] - col0
        num_seq = cu.numel() - 1 if cu is not None else B
        dh = dh.contiguous() if dh is not None else torch.zeros_like(h)
        dhf = dhf.float().contiguous() if dhf is not None else None
        dz, dv = empty(z.shape, z.dtype, z.device), empty(v.shape, v.dtype, v.device)
        up = TUNE.get("upcast16", True)
        zl, vl, hl, dhl = as_loaded(z, up), as_loaded(v, up), as_loaded(h, up), as_loaded(dh, up)
        if chunk is not None:
            cfg = _config(num_seq * pt[0].shape[1], N, m, v.device, bwd=True, logits=col0 == 1,
                          chunked=True)
            dh0 = chunked_backward(fg_launch_fwd, companion_bwd_kernel, zl, vl, h0, hl, dhl, dhf,
                                   pt[0], cu, T, N, m, col0, code, eps, chunk, cfg,
                                   _unrolled(m, True, col0 == 1), need_dh0, dz, dv, empty)
        else:
            dh0 = empty((num_seq, N, m), torch.float32, v.device) if need_dh0 else None
            bn, mp, warps, stages = _config(num_seq, N, m, v.device, bwd=True, logits=col0 == 1)
            companion_bwd_kernel[(num_seq, cdiv(N, bn))](
                zl, vl, h0 if h0 is not None else h, hl, dhl, dhf if dhf is not None else dh, dz, dv,
                dh0 if dh0 is not None else dv, cu if cu is not None else h, h, T, N, 0, eps,
                M=m, MP=mp, BN=bn, COL0=col0, VARIANT=code, NS=stages, HAS_H0=h0 is not None,
                HAS_DHF=dhf is not None, STORE_DH0=dh0 is not None, IS_VARLEN=cu is not None,
                UNROLL=_unrolled(m, True, col0 == 1), num_warps=warps, num_stages=stages)
        if dh0 is not None:
            dh0 = dh0.to(h0_dtype)
        return dz, dv, dh0, None, None, None, None, None, None, None


def _check(z_name, z, v_name, v, col0, initial_state, cu_seqlens):
    check_float_tensor(z_name, z, 4, "(B, T, N, m+1)" if col0 else "(B, T, N, m)")
    check_float_tensor(v_name, v, 3, "(B, T, N)")
    B, T, N = v.shape
    m = z.shape[-1] - col0
    if tuple(z.shape[:3]) != (B, T, N) or not 1 <= m <= MAX_M:
        raise ValueError(f"{z_name} must have shape (B, T, N, {'m+1' if col0 else 'm'}) with "
                         f"(B, T, N) = {(B, T, N)} from {v_name} and 1 <= m <= {MAX_M}, got "
                         f"{tuple(z.shape)}")
    if z.device != v.device:
        raise ValueError(f"{z_name} and {v_name} must be on one device, got {z.device} and {v.device}")
    num_seq = check_cu_seqlens(cu_seqlens, B, T, v.device)
    check_state("initial_state", initial_state, (num_seq, N, m), v.device)
    return num_seq


def companion_scan(logits: Tensor, v: Tensor, variant: str = "softmax", eps: float = 1e-6,
                   initial_state: Tensor | None = None, output_final_state: bool = False,
                   cu_seqlens: Tensor | None = None):
    """H-LRU scan from gate logits, O(m) per channel-step.

    ``(a, a0) = normalize_gates(logits, variant, eps)`` per channel (``a0`` = index 0,
    ``a_1..a_m`` = indices ``1..m``); ``h_t = Σ_{i=1..m} a_{i,t} h_{t-i} + a0_t v_t``.

    Args:
        logits: ``(B, T, N, m+1)``; v: ``(B, T, N)``.
        initial_state: ``(B | num_seqs, N, m)`` = ``(h_0, h_{-1}, …)`` newest first.
        output_final_state: also return the fp32 ``(B | num_seqs, N, m)`` final shift register.
        cu_seqlens: int64 ``(num_seqs + 1,)`` packed-sequence offsets (``B == 1``).

    Returns:
        ``(h, h_final or None)``, ``h`` the newest component ``(B, T, N)``.
    """
    num_seq = _check("logits", logits, "v", v, 1, initial_state, cu_seqlens)
    eps = check_eps(eps)
    code = variant_code(variant)
    out_dtype = torch.promote_types(logits.dtype, v.dtype)
    if not use_triton(v, companion_fwd_kernel):
        return companion_scan_ref(logits, v, variant, eps, initial_state, output_final_state,
                                  cu_seqlens, dtype=torch.float32)
    chunk = choose_chunk(cu_seqlens, num_seq, v.shape[1], v.shape[2], logits.shape[-1] - 1, v.device)
    h, hf = _CompanionFn.apply(logits, v, initial_state, cu_seqlens, 1, code, eps,
                               bool(output_final_state), out_dtype, chunk)
    return h, (hf if output_final_state else None)


def companion_scan_coeffs(a: Tensor, b: Tensor, initial_state: Tensor | None = None,
                          output_final_state: bool = False, cu_seqlens: Tensor | None = None):
    """Companion scan over materialised coefficients: ``h_t = Σ_{i=1..m} a[..., t, i-1] h_{t-i} + b_t``.

    ``a``: ``(B, T, N, m)`` (``a[..., 0]`` multiplies ``h_{t-1}``); ``b``: ``(B, T, N)``. States as in
    :func:`companion_scan`. This is what ``lrnn_scan.scan(Companion(a), b)`` dispatches to.
    """
    num_seq = _check("a", a, "b", b, 0, initial_state, cu_seqlens)
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    if not use_triton(b, companion_fwd_kernel):
        return companion_scan_coeffs_ref(a, b, initial_state, output_final_state, cu_seqlens,
                                         dtype=torch.float32)
    chunk = choose_chunk(cu_seqlens, num_seq, b.shape[1], b.shape[2], a.shape[-1], b.device, logits=False)
    h, hf = _CompanionFn.apply(a, b, initial_state, cu_seqlens, 0, 5, 1.0,
                               bool(output_final_state), out_dtype, chunk)
    return h, (hf if output_final_state else None)
