"""The delta-product kernels' launch settings and storage choices (``TUNE``), with the readers
that check each entry where a launch takes it. Each entry's comment says what was measured (device,
date, shapes) for the value it holds; the tuning logs (TUNING_LOG.md, TUNING_LOG_2.md) have the
rest. ``function.py`` reads them; benchmarks and tests set entries on this one dict."""
from __future__ import annotations

import torch

# Launch settings, (num_warps, num_stages[, BV]) per kernel, and storage choices. Module-level
# rather than call arguments so that benchmark sweeps can set them on the device;
# the values are the measured choice (H200, TUNING.md). Old settings in comments.
TUNE = dict(
    wy_split=True,         # C = 64: tri_inv64 + wu_fwd (wy64.py), 1.63 -> 0.72 ms (n_h=1 fwd)
    wy=(4, 3),             # wy_fwd_kernel (C != 64, or wy_split off)
    inv=(1, 1),            # 1 warp: the 16x16 substitutions reduce within a warp (2 warps: 1.6x slower)
    wu=(2, 2, 64),
    state_fwd=(4, 3, 64),  # 8 warps / BV 32 / 1 stage were all slower
    output=(4, 3, 64),
    # dv_local_kernel: P formed once, its V tile of 128 columns taken 32 at a time (dv_local_bvl,
    # state.py BVL), the dO loads run ahead by 3 stages. H200 (2026-12-03, fifty-eighth session,
    # B8 T4096 H16 K=V=128 bf16, torch.profiler): the kernel 264 / 276 / 490 / 511 us -> 185 / 195
    # / 321 / 333 at n_h 1 ungated / gated, 2 ungated / gated; fwd+bwd 0.972-0.980x. Before:
    # (4, 2, 128) in one pass (None), and (4, 3, 64) before that; fla's dv_local: 269 us at n_h 2 gated
    dv_local=(2, 3, 128),
    dv_local_bvl=32,
    state_bwd=(4, 3, 64),  # (4, 1, 32): faster at n_h=2 gated, slower at n_h=1 ungated
    # dqkwg_bwd in two K slices on 4 warps (a third grid axis; dO Vn^T recomputed per slice, the
    # partial dG summed): sm_90a bf16 n_h 2 (Triton 3.6 ptxas) 204 / 254 registers and 136 / 120
    # KiB of shared memory a program (one an SM) at one slice on 8 warps -> two slices on 4 warps
    # at 3 stages. H200 (2026-12-03, fifty-ninth session, B8 T4096 H16 K=V=128 bf16): the kernel
    # 1913 / 2271 -> 1619 / 2022 us at n_h 2 ungated / gated, fwd+bwd 0.960-0.973x at n_h 1-2.
    # At K=V=64 neutral (the old default 0.989-1.009x). Lost at K=128: two slices on 8 warps
    # 1.057-1.096x, on 4 warps at 2 stages 0.991-1.005x. The default before: (8, 3, 32) at one
    # slice (2 slices on 8 warps lost on an H100, 2026-11-25)
    dqkwg=(4, 3, 32),
    # the gated dqkwg_bwd's gate term as rowsum(Q ⊙ dQ) − rowsum(K ⊙ dK) off its own gradient tiles
    # (dqkwg_bwd.py DG_GRADS): no second Q K^T dot, no [64, 64] row and column sums (the gated
    # tail's cross-warp reductions, TUNING.md): sm_90a SASS of the gated bf16 launch 2464 -> 2136
    # instructions, BAR 77 -> 63, SHFL 77 -> 40, HGMMA 40 -> 32. H200 2026-11-26 (ninth session), B8
    # T4096 H16 K=V=128 bf16, gated fwd+bwd 0.981 / 0.979 / 0.969x at n_h 1 / 2 / 4; dg error 2.58e-3
    # -> 2.80e-3 (n_h 1; tf32 dots feed it where False sums exact bf16 products). False: that form
    dqkwg_dg_grads=True,
    # dqkwg_bwd's dO H^T on the 16-bit dO and stored H tiles as they are (dqkwg_bwd.py RAW_H; the
    # same exact products as the tf32 dot of their fp32 copies). GPU-only (_raw). H100 2026-11-26
    # (twelfth session), B8 T4096 H16 K=V=128 bf16, fwd+bwd 0.983-0.998x at n_h 2-4 alone, with
    # token_chunk_output_grad 0.967-0.998x (TUNING_LOG.md); same error ratios
    dqkwg_raw_h=True,
    # capped at BK // 16 (tl.dot needs 16 columns a slice); 2 since the fifty-ninth session. With
    # dqkwg_fuse_wy 4 compiles without spills (sm_90a, Triton 3.6 ptxas, K=V=128 bf16, 4 warps), 2
    # spills 344 / 644 B a thread (ungated / gated)
    dqkwg_ksplit=2,
    # the K slices of one chunk next to each other in launch order (grid (NC·ks, H) instead of
    # (NC, H, ks), where NC·H programs ran between them): the second slice's Vn, dVn, dO reads can
    # hit L2. H200 (2026-12-03, sixtieth session, B8 T4096 H16 K=V=128 bf16): the kernel 1627 /
    # 2049 -> 1520 / 1926 us at n_h 2 ungated / gated, fwd+bwd 0.981-0.987x at n_h 1, 2, 4, same
    # errors. False: the third grid axis
    dqkwg_slices_adjacent=True,
    # wy_bwd's key side in 4 K slices, two passes (wy_bwd.py KS), 4 warps: fewer live fp32 [C, K]
    # tiles, 72 KiB shared memory (two CTAs per SM). H100 2026-11-25 (seventh session), B8 T4096
    # H16 K=V=128 bf16: fwd+bwd 0.899-0.908x the time of (ksplit 1, 8 warps) at n_h 1-2
    wy_bwd=(4, 1, 64),     # was (8, 1, 64); before that (8, 3, 32)
    wy_bwd_ksplit=4,       # capped at BK // 16 (tl.dot needs 16 columns a slice)
    # the sliced wy_bwd stores dβ and dg before its second pass (same arithmetic): sm_90a spills of
    # the bf16 launches 44 -> 0 B a thread ungated, 72 -> 24 gated (tools/aot_check.py, K=V=128),
    # but no faster: H200 2026-11-26 (ninth session) fwd+bwd 1.001-1.005x at n_h 1-4. Off
    wy_bwd_early_db=False,
    # FORM 2 ("assoc"): the WY backward from X = A^T dVn and Vn (wy_bwd_vn.py: dA = dVn (M Vn)^T, so
    # E = strictLower(-X Vn^T) ⊙ Γ, no A^T dA A^T); the state kernel stores X in place of dVn and
    # dqkwg_bwd folds the A^T dW = -X H^T terms into dk, dβ, dG (no dW in HBM). False: wy_bwd.py
    wy_bwd_vn=True,
    wy_bwd_vn_cfg=(4, 2, 64),    # (num_warps, num_stages, BV) of wy_bwd_vn_kernel
    wy_bwd_vn_ksplit=2,          # its key side in slices (one pass), capped at BK // 16
    # with wy_bwd_vn: dqkwg_bwd does wy_bwd_vn_kernel's work too (dqkwg_bwd.py FUSE_WY): X Vn^T beside
    # dO Vn^T, dV and the (dS + dS^T) K columns per K slice, dk written once in the inputs' dtype
    # (no fp32 partial dk, no second read of X, Vn, K); a small kernel sums the partial dβ, dG.
    # Lost on an H200 (2026-12-03, sixty-first session, B8 T4096 H16 K=V=128 bf16, n_h 2): fwd+bwd
    # 1.018 / 1.068x the unfused time at 4 K slices (ungated / gated; the fused kernel 2660 / 3532
    # us against 1532 + 1041 / 1937 + 1170), 1.064 / 1.106x at 2 slices on 8 warps, 1.165 / 1.278x
    # at 4 slices over V tiles of 64; same errors. Opt-in (with dqkwg_ksplit 4)
    dqkwg_fuse_wy=False,
    inter_16bit=False,     # W, U stored in the inputs' dtype: error ratio 5.5e-3 > 5e-3 bound, off
    # Vn stored in the inputs' 16-bit dtype (the state update keeps fp32 registers). "no_grad": only
    # in a forward without gradients, where the output kernel is its one reader (H200 2026-11-26, B8
    # T4096 H16 K=V=128 bf16, with token_chunk_output: fwd 0.83-0.95x the fp32-Vn time at n_h 2-4);
    # True: also when the backward reads it (its dk error 4.78e-3 is too close to the 5e-3 bound)
    vn_16bit="no_grad",
    # the backward's chunk-start state gradients dH stored in 16 bits (fla stores them in the inputs'
    # dtype): 2 bytes instead of 4 per element written by the state kernel and read by dqkwg_bwd
    # (B8 T4096 H16 K=V=128 n_h=1: 268 MB less each way); the recurrence stays fp32 in registers.
    # H200 2026-11-26, n_h=1: fwd+bwd 0.982x / 0.988x (ungated / gated), dk error 4.06e-3 -> 4.18e-3;
    # ninth session: 0.984 / 0.988 (n_h 1), 0.990 / 1.018 (n_h 2), 0.990 / 1.012 (n_h 4), and with
    # state_bwd_reload_k no gain over it alone. Off (a mixed result for a larger error)
    dhs_16bit=False,
    hs_16bit=True,         # chunk-start states stored in 16 bits for read-out and backward only;
                           # the recurrence stays fp32 in registers (error 4.68e-3 -> 4.71e-3)
    # W, U formed in the state kernels (state_fused.py) instead of stored by wu_fwd. Measured on an
    # H100 (2026-11-24, B8 T4096 H16 K=V=128 bf16, TUNING.md "Fused W/U"): "assoc" with inv_batched
    # fwd 1.904 -> 1.294 ms (n_h=1), 3.640 -> 2.472 (n_h=2); fwd+bwd 6.669 -> 5.831, 12.79 -> 11.15.
    # "wu" was 1.09x slower than False. On the torch.compile custom-op route W, U stay stored.
    fuse_wu="assoc",       # False: wu_fwd stores W, U (fp32). "wu": W, U in registers from A, K, V,
                           # beta, g (same dots). "assoc": Vn = A (diag(b) V - diag(b g) K H),
                           # W^T dVn = (diag(b g) K)^T A^T dVn
    state_fused=(4, 3, 64),      # state_fwd_fused_kernel (fuse_wu on)
    state_bwd_fused=(4, 1, 64),  # state_bwd_fused_kernel (fuse_wu on); was (4, 3, 64)
    # the "assoc" backward with fewer live fp32 tiles (state_fused.py LEAN) at 1 stage: H100
    # 2026-11-25 (seventh session), B8 T4096 H16 K=V=128 bf16, fwd+bwd 0.871-0.909x the time of
    # (False, 3 stages) at n_h 1-2, gated and not; sm_90a spills 830 -> 136 B gated (TUNING.md)
    state_bwd_lean=True,
    # the lean step loads its key tile again (an L2 hit) for the K^T t dot instead of keeping the
    # fp32 [C, K] tile live across the A^T dVn dot: sm_90a spills (Triton 3.6 ptxas, K=V=128, n_h=1,
    # tools/aot_check.py) 288/252 -> 156/120 B a thread ungated, 136/100 -> 24/12 gated. H200
    # 2026-11-26 (ninth session), B8 T4096 H16 K=V=128 bf16, fwd+bwd: ungated 0.987 / 0.972 / 0.964x
    # at n_h 1 / 2 / 4, gated 1.005 / 1.001 / 0.999x. "ungated": reload only without the gate;
    # True / False: always / never
    state_bwd_reload_k="ungated",
    # TMA stores (True / False / "gated" / "ungated": that case only) where the GPU and the buffer
    # allow them (compute capability 9+, 16-byte rows): state_bwd_fused's dH' each chunk
    # (state_fused.py TMA_DH), state_fwd_fused's chunk-start states (TMA_HS; not with the
    # token-chunk states) and, where every chunk is full (TMA cannot mask a short chunk's rows),
    # Vn (TMA_VN, taking precedence over TMA_HS: both need 125 KB of shared memory, 1 program an
    # SM) and A^T dVn (TMA_X). H100 (2026-12-07, sixty-fifth session, B8 T4096 H16 K=V=128 bf16,
    # delta_variants.py, kernel µs at n_h 1 / 2 / 4): gated state_fwd_fused with Vn by TMA 521 /
    # 1038 / 2076 -> 473 / 944 / 1887, with H by TMA -> 484 / 968 / 1939; ungated H by TMA 466 /
    # 929 / 1860 -> 463 / 918 / 1826, Vn by TMA 473 / 944 / 1868 (lost); state_bwd_fused with dH'
    # and A^T dVn by TMA gated 838 / 1663 / 3271 -> 818 / 1582 / 3137, ungated 832 / 1583 / 3045
    # -> 863 / 1654 / 3225 (lost). So: Vn gated, H wherever Vn is not, the backward's two gated
    state_bwd_tma_dh="gated",
    state_fwd_tma_hs=True,
    state_fwd_tma_vn="gated",
    state_bwd_tma_x="gated",
    # the lean state backward forming the intra-chunk P^T dO itself (state_fused.py _local_dv) instead
    # of reading it from dv_local_kernel: one launch and one [Ls, H, V] fp32 write and read fewer,
    # two more dots a chunk (off the serial chain). Opt-in, not yet timed
    state_bwd_local_dv=False,
    # dqkwg_bwd's dk tile stored by TMA where every chunk is full (dqkwg_bwd.py TMA_DK): sm_90a
    # 2488 -> 2400 SASS instructions gated, 1776 -> 1720 ungated, but no faster (H100 2026-12-07:
    # the kernel 1.000-1.003x ungated, 0.999-1.017x gated at n_h 1-4). Opt-in
    dqkwg_tma_dk=False,
    # forward without gradients at n_h > 1: one chunk-start state per 64 tokens instead of per 64
    # sub-steps (as fla keeps them), and an output kernel over token chunks (output.py
    # output_tok_fwd_kernel): n_h times fewer state bytes (at n_h = 4, B8 T4096 H16 K=V=128:
    # 0.27 GB instead of 1.07 GB, written and read). H200 2026-11-26 (eighth session), bf16 Vn: fwd
    # 0.946 / 0.904 (n_h 2, ungated / gated) and 0.850 / 0.833 (n_h 4) the per-chunk time
    token_chunk_output=True,
    # the same output kernel in a forward with gradients: the states stay one per chunk (the
    # backward reads them all) and each token chunk reads its first chunk's (output.py HS_CHUNK):
    # dense query rows, n_h times fewer state tiles read by the output kernel. H100 2026-11-26
    # (twelfth session): fwd+bwd 0.974-1.002x at n_h 2-4 alone (TUNING_LOG.md)
    token_chunk_output_grad=True,
    # the token-chunk state store predicated instead of branched (state_fused.py HS_PRED): sm_90a
    # spills of the ungated kernel 696 / 672 -> 152 / 128 B a thread. H200 2026-11-26 (ninth
    # session), fwd: 0.875 / 0.883x the branched store's time ungated at n_h 2 / 4, 0.990 / 0.995x gated
    token_state_pred=True,
    # the output kernels' Q H on the 16-bit q and H tiles as stored (output.py RAW_H; bf16 MMA at
    # twice the tf32 rate, exact products): sm_90a registers 168 -> 94-102, shared memory 80 -> 64
    # KiB (K=V=128, tools/aot_check.py). GPU-only (the interpreter has no bf16 dot: _raw). H200
    # 2026-11-26 (ninth session), B8 T4096 H16 K=V=128 bf16: fwd 0.837-0.959x, fwd+bwd 0.954-0.964x
    # the fp32-copy form's time at n_h 1-4, gated or not; the same bf16 error ratios
    output_raw_h=True,
    inv_batched=True,      # tri_inv64: the four 16x16 diagonal substitutions as one [4, 16, 16] tile
                           # (H100: 0.95x the time of four separate ones, n_h=1 fwd)
    # keep the forward's chunk-start states and Vn for the backward instead of recomputing them
    # there (one state-kernel launch fewer per backward, the same values bit for bit); memory:
    # NC·H·K·V 16-bit states + Ls·H·V float32 Vn alive between forward and backward (B8 T4096 H16
    # K=V=128, n_h=1: 268 + 268 MB). H100, 2026-11-25 (delta_throughput.py --variants, bf16,
    # TUNING.md "Saved states"): fwd+bwd 0.903-0.909x the recomputing time at n_h 1-2, gated or not
    # (n_h=1 ungated 5.896 -> 5.337 ms). False: recompute (less memory). The torch.compile custom
    # op always recomputes.
    save_states=True,
    a_16bit=False,         # A stored in float16 for 16-bit inputs (fp32 in registers; the dots read it as
                           # tf32, 10 mantissa bits like fp16). bf16 A: error +9 %, fails; fp16 overflows
                           # past 65504 (adversarial keys), so opt-in only (TUNING.md "Fused W/U")
    # register caps (ptx .maxnreg) by launch: "inv" (tri_inv64), "wy_bwd", "wy_bwd_vn", "dqkwg",
    # "state_fused" / "state_bwd_fused" (the fused state kernels) and "output_tok"; a key with
    # ":gated" / ":ungated" appended caps that case only and wins over the plain one. The first two sit at 255
    # registers a thread on sm_90a (K=V=128 bf16), which holds tri_inv64 (1 warp) to 8 programs
    # an SM and wy_bwd (4 warps, 72 KiB shared) to 2; a cap trades spills for programs in flight
    # (tri_inv64 at 128: 16, wy_bwd at 168: 3). Opt-in: on an H100 (2026-11-26) they lost everywhere,
    # the spills costing more than the programs gained (tri_inv64 at 128 fwd 1.35-1.45x, wy_bwd at
    # 168 fwd+bwd 1.03-1.04x; RESULTS.md).
    # "output_tok" (output_tok_fwd_kernel, the token-chunk output at n_h > 1, with gradients or
    # without): capped at 160 by default. Gated, it takes 195 registers uncapped where the ungated
    # one takes 154 (sm_90a, Triton 3.6, K=V=128 bf16, RAW_H, n_h 4; 190 / 144 at n_h 2): 2 four-warp
    # programs an SM instead of 3. At 160 it compiles without spills (4 bytes at n_h 2), and an
    # H200 (2026-12-03, delta_throughput.py --variants out_r160, B8 T4096 H16 bf16) ran the gated
    # forward 0.949x / 0.950x the uncapped time at n_h 2 / 4 (1.941 -> 1.843 ms, 3.694 -> 3.508
    # ms; n_h 1 does not launch it: 1.001x).
    # Not for output_fwd_kernel: at 94 / 113 registers uncapped, a cap of 160 lets ptxas take
    # 150 / 154, fewer programs an SM.
    # "wy_bwd_vn:ungated" at 168 (208-229 registers uncapped, 49 KiB shared: 2 four-warp programs
    # an SM; capped 3, with 88 B of sm_90a spills a thread): H200 (2026-12-04, n_h 2) the kernel
    # 1041 -> 890 us; H100 (2026-12-07) 602 / 1196 / 2374 -> 571 / 1131 / 2255 us at n_h 1 / 2 / 4,
    # fwd+bwd 0.992 / 0.991 / 0.992x. Gated it spills 280 B and lost (H200 1.011x)
    maxnreg={"output_tok": 160, "wy_bwd_vn:ungated": 168},
    # float32 inputs with TF32 off (torch.backends.cuda.matmul.allow_tf32 False): the precision of
    # the kernels' dots. "tf32x3" (default): three tf32 products per dot on the tensor cores (about
    # fp32 accuracy, as summary.py's 16 x 16 tiles use). "ieee": exact fp32 products on the CUDA
    # cores; on sm_90a (Triton 3.6's ptxas, K=V=128) those kernels compile to 32 registers a thread
    # with 17-74 KB of spills (state_bwd_fused 60-69 KB, wy_bwd 71-74 KB; loops of 34-50 thousand
    # instructions) where tf32x3 takes 255 registers with 0.1-2.7 KB (fifty-sixth session,
    # tools/aot_check.py). H200 (2026-12-03, delta_throughput.py --dtype fp32, ieee against
    # tf32x3, B8 T4096 H16 K=V=128, n_h 1): forward 119.4 -> 6.62 ms ungated, 118.4 -> 7.52 ms
    # gated; fwd+bwd 288.3 -> 18.2 ms ungated; worst error against fp64 1.4e-6 (ieee 8.3e-7), bound
    # 1e-4; tests/gpu/test_gpu_delta.py::test_fp32_varlen_vs_fp64 passed under both. The blocked
    # inverse's off-diagonal merge stays ieee either way.
    fp32_dot="tf32x3",
)

_FP32_DOTS = ("ieee", "tf32x3")

_FORMS = {False: 0, None: 0, "wu": 1, True: 1, "assoc": 2}


def _fuse_form():
    """0: W, U stored (wu_fwd / wy_fwd); 1, 2: formed in the state kernels (state_fused.py FORM)."""
    f = TUNE["fuse_wu"]
    if f not in _FORMS:
        raise ValueError(f'TUNE["fuse_wu"] must be False, "wu" or "assoc", got {f!r}')
    return _FORMS[f]


_REG_LAUNCHES = ("inv", "output_tok", "state_fused", "state_bwd_fused", "dqkwg", "wy_bwd", "wy_bwd_vn")


def _regs(key, use_g):
    """Launch options for launch ``key``'s register cap: ``{}`` or ``{"maxnreg": n}``.
    ``TUNE["maxnreg"]`` maps a launch name (``_REG_LAUNCHES``), or a name with ``":gated"`` /
    ``":ungated"`` (which takes precedence for that case), to a cap in [24, 255]. Every entry is
    checked, whichever launch asks (a bad entry of a launch this call skips is still refused)."""
    caps = TUNE["maxnreg"]
    if not isinstance(caps, dict):
        raise ValueError(f'TUNE["maxnreg"] must be a dict of launch name -> register cap, got {caps!r}')
    for name, n in caps.items():
        base, _, case = name.partition(":") if isinstance(name, str) else (None, "", "")
        if base not in _REG_LAUNCHES or case not in ("", "gated", "ungated"):
            raise ValueError(f'TUNE["maxnreg"] key {name!r} must be one of {_REG_LAUNCHES}, optionally '
                             f'with ":gated" or ":ungated"')
        if isinstance(n, bool) or not isinstance(n, int) or not 24 <= n <= 255:
            raise ValueError(f'TUNE["maxnreg"][{name!r}] must be an int in [24, 255], got {n!r}')
    n = caps.get(f"{key}:{'gated' if use_g else 'ungated'}", caps.get(key))
    return {} if n is None else {"maxnreg": n}


_CASE_SWITCHES = ("state_bwd_reload_k", "state_bwd_tma_dh", "state_fwd_tma_hs", "state_fwd_tma_vn",
                  "state_bwd_tma_x", "dqkwg_tma_dk")


def _case_on(key, use_g):
    """``TUNE[key]`` for a switch that may hold for one case only: True, False, ``"gated"`` or
    ``"ungated"``."""
    val = TUNE[key]
    if val not in (True, False, "gated", "ungated"):
        raise ValueError(f'TUNE["{key}"] must be True, False, "gated" or "ungated", got {val!r}')
    return val is True or val == ("gated" if use_g else "ungated")


def _bv(name, BVf):
    """The V tile of kernel ``name`` from TUNE, capped by the padded V."""
    return min(BVf, TUNE[name][2])


def _dv_local_bvl(BV):
    """Columns per step of ``dv_local_kernel``'s V tile of ``BV`` (``TUNE["dv_local_bvl"]``): ``BV``
    for None (one pass), else a power of two >= 16 (``tl.dot``), at most ``BV``."""
    n = TUNE["dv_local_bvl"]
    if n is None:
        return BV
    if isinstance(n, bool) or not isinstance(n, int) or n < 16 or n & (n - 1):
        raise ValueError(f'TUNE["dv_local_bvl"] must be None or a power of two >= 16, got {n!r}')
    return min(n, BV)


def _ksplit(key, BK):
    """K slices from ``TUNE[key]`` (``"dqkwg_ksplit"``: ``dqkwg_bwd``; ``"wy_bwd_ksplit"``:
    ``wy_bwd``'s key-side work): a power of two, at most ``BK // 16`` (``tl.dot`` needs 16 columns)."""
    ks = TUNE[key]
    if not isinstance(ks, int) or ks < 1 or ks & (ks - 1):
        raise ValueError(f'TUNE["{key}"] must be a power of two >= 1, got {ks!r}')
    return max(1, min(ks, BK // 16))


def _store_dtype(x_dtype, key, no_grad=False):
    """float32, or the inputs' 16-bit dtype where TUNE[key] asks for it (halves those bytes):
    ``True``, or ``"no_grad"`` in a forward whose results no backward reads."""
    want = TUNE[key] is True or (TUNE[key] == "no_grad" and no_grad)
    return x_dtype if want and x_dtype in (torch.float16, torch.bfloat16) else torch.float32
