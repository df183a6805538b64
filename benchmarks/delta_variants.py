"""The ``function.TUNE`` variants that ``delta_throughput.py --variants`` times against the default
(each a dict of overrides of ``lrnn_scan.kernels.delta_product.function.TUNE``; the comments say
what each changes and what it measured). ``tests/test_tools_results.py`` checks that every key
names a ``TUNE`` entry."""

# settings of lrnn_scan.kernels.delta_product.function.TUNE (TUNING.md "Fused W/U"), each a set
# of overrides; the combinations compile nothing beyond their parts
VARIANTS = {
    "default": {},                                   # fuse_wu "assoc" + inv_batched (H100 2026-11-24),
                                                     # save_states (H100 2026-11-25)
    "stored_wu": {"fuse_wu": False, "inv_batched": False},  # the default until 2026-11-24
    "fuse_wu": {"fuse_wu": "wu"},
    "fuse_assoc": {"fuse_wu": "assoc"},
    "inv_batched": {"inv_batched": True},
    "fuse_wu+inv_batched": {"fuse_wu": "wu", "inv_batched": True},
    "fuse_assoc+inv_batched": {"fuse_wu": "assoc", "inv_batched": True},
    # launch settings of the fused state kernels (more registers live: A, K, W); by name only
    "fuse_wu_8w": {"fuse_wu": "wu", "state_fused": (8, 2, 64), "state_bwd_fused": (8, 2, 64)},
    "fuse_assoc_8w": {"fuse_wu": "assoc", "state_fused": (8, 2, 64), "state_bwd_fused": (8, 2, 64)},
    "fuse_wu_bv32": {"fuse_wu": "wu", "state_fused": (4, 3, 32), "state_bwd_fused": (4, 3, 32)},
    # A stored in float16 (new pointer dtype: recompiles tri_inv64, wu_fwd, wy_bwd, the state kernels)
    "a_16bit": {"a_16bit": True},
    "fuse_wu+a_16bit": {"fuse_wu": "wu", "a_16bit": True},
    "fuse_assoc+a_16bit": {"fuse_wu": "assoc", "a_16bit": True},
    # the backward reuses the forward's chunk-start states and Vn (no state recompute; more memory;
    # the default since 2026-11-25); recompute_states = the default before
    "save_states": {"save_states": True},
    "recompute_states": {"save_states": False},
    "save_states+a_16bit": {"save_states": True, "a_16bit": True},
    # dqkwg_bwd split over K (partial dG summed): fewer accumulators per program, dO Vn^T per slice
    "dqkwg_k2": {"dqkwg_ksplit": 2},
    "dqkwg_k2_4w": {"dqkwg_ksplit": 2, "dqkwg": (4, 3, 32)},
    "dqkwg_4w": {"dqkwg": (4, 3, 32)},
    # forward launch settings (issue 4: the gated forward was 1.19x fla's on an H100, 2026-11-25;
    # the profile: state_fwd_fused 0.50 / 0.65 ms ungated / gated, output_fwd 0.53 / 0.55, tri_inv64
    # 0.25 / 0.29): more programs (BV 32), other pipelining depths, 8 warps
    "state_bv32": {"state_fused": (4, 3, 32)},
    "state_ns2": {"state_fused": (4, 2, 64)},
    "state_ns4": {"state_fused": (4, 4, 64)},
    "state_8w": {"state_fused": (8, 3, 64)},
    "output_ns2": {"output": (4, 2, 64)},
    "output_bv32": {"output": (4, 3, 32)},
    "output_8w_bv128": {"output": (8, 2, 128)},
    # tri_inv64 with 2 / 4 warps: with 1 it spills ~1.1 KB per thread on sm_90a, with 2 none ungated
    # (56 B gated); 2 warps were 1.6x slower on an H200 before the batched inverse (TUNE comment);
    # with it, 2 warps: fwd 1.03-1.04x on an H100 (2026-11-25, seventh session)
    "inv_2w": {"inv": (2, 1)},
    "inv_4w": {"inv": (4, 1)},
    # wy_bwd's key side in K slices (wy_bwd.py KS). sm_90a, RAW, K=128, ungated / gated spill bytes,
    # shared memory: default (8 warps) 44 / 112 B, 160 KiB (one CTA per SM); 4 slices 0 / 84 B,
    # 72 KiB; 4 slices at 4 warps 44 / 72 B, 72 KiB, 255 registers: two CTAs per SM
    "wy_bwd_k2": {"wy_bwd_ksplit": 2},
    "wy_bwd_k4_8w": {"wy_bwd_ksplit": 4, "wy_bwd": (8, 1, 64)},   # 1.03x the unsplit 8-warp time
    "wy_bwd_k4_4w": {"wy_bwd_ksplit": 4, "wy_bwd": (4, 1, 64)},   # the default since 2026-11-25 (7th)
    "wy_bwd_k1": {"wy_bwd_ksplit": 1, "wy_bwd": (8, 1, 64)},       # the default before: 1.10-1.11x
    # the "assoc" backward state kernel (state_fused.py LEAN). sm_90a spills per thread (ptxas,
    # K=V=128, 4 warps), ungated / gated: first order (3 stages) 524 / 830 bytes, lean 520 / 504,
    # lean with 1 stage 288 / 136 (the default since 2026-11-25, seventh session: H100 fwd+bwd
    # 0.871-0.909x bwd_first at n_h 1-2; bwd_first_ns1 0.905-0.985x, bwd_lean_ns3 0.928-0.966x)
    "bwd_first": {"state_bwd_lean": False, "state_bwd_fused": (4, 3, 64)},
    "bwd_first_ns1": {"state_bwd_lean": False},
    "bwd_lean_ns3": {"state_bwd_fused": (4, 3, 64)},
    # the forward without gradients before 2026-11-26: one state per 64 sub-steps and fp32 Vn
    # (the defaults now keep one state per 64 tokens at n_h > 1 and Vn in bf16 there). These change
    # the "fwd" rows only: fwd+bwd keeps every chunk's state and an fp32 Vn for the backward
    "per_chunk_fp32vn": {"token_chunk_output": False, "vn_16bit": False},
    "per_chunk": {"token_chunk_output": False},
    "fp32vn": {"vn_16bit": False},
    # Vn in bf16 for the backward too (dk error 4.78e-3 on 2026-11-24, close to the 5e-3 bound)
    "vn16_always": {"vn_16bit": True},
    # the backward's dH chunk states in bf16 (fla keeps them in the inputs' dtype): 268 MB less
    # written by the state kernel and read by dqkwg_bwd at n_h = 1, B8 T4096 H16 K=V=128
    "dhs16": {"dhs_16bit": True},
    # the lean backward state step reloads its key tile (sm_90a spills 288 -> 156 B ungated,
    # 136 -> 24 gated at n_h = 1)
    "bwd_reload_k": {"state_bwd_reload_k": True},
    "bwd_reload_k_dhs16": {"state_bwd_reload_k": True, "dhs_16bit": True},
    # the output kernels' Q H on the stored bf16 tiles (registers 168 -> ~96, smem 80 -> 64 KiB)
    "out_raw_h": {"output_raw_h": True},
    # the sliced wy_bwd stores dbeta, dg before its second pass (spills 44 -> 0 / 72 -> 24 B);
    # the token-chunk state store predicated (ungated spills 696 -> 152 B; the "fwd" rows)
    "wy_early_db": {"wy_bwd_early_db": True},
    "tok_pred": {"token_state_pred": True},
    # the ninth session (2026-11-26) changed these defaults: the eighth session's settings
    # together (s8_default) and one at a time, and the key reload with the gate too
    "s8_default": {"output_raw_h": False, "token_state_pred": False, "state_bwd_reload_k": False,
                   "dqkwg_dg_grads": False},
    "no_raw_h": {"output_raw_h": False},
    "tok_branch": {"token_state_pred": False},
    "no_reload_k": {"state_bwd_reload_k": False},
    "reload_k_always": {"state_bwd_reload_k": True},
    # the gated dqkwg_bwd's gate term as rowsum(Q dQ) - rowsum(K dK) (no second Q K^T, no [64, 64]
    # row and column sums; default since 2026-11-26), and the Z form before it; gated fwd+bwd only
    "dg_grads": {"dqkwg_dg_grads": True},
    "dg_z": {"dqkwg_dg_grads": False},
    # register caps (TUNE["maxnreg"]): tri_inv64 at 255 registers runs 8 one-warp programs an SM,
    # wy_bwd 2 four-warp ones; capped, more fit (16 / 21 at 128 / 96; wy_bwd 3 at 168), at the
    # cost of spills (sm_90a: tri_inv64 1048 -> 3204 / 3872 B a thread, wy_bwd 32 -> 296 / 628)
    "inv_r128": {"maxnreg": {"inv": 128}},
    "inv_r96": {"maxnreg": {"inv": 96}},
    "wy_bwd_r168": {"maxnreg": {"wy_bwd": 168}},
    # the token-chunk output kernel capped at 160 registers: gated 195 -> 160 without spills
    # (sm_90a), 3 programs an SM instead of 2; the default since 2026-12-03 (H200 gated fwd 0.949x /
    # 0.950x at n_h 2 / 4). out_nocap: no cap anywhere, the default before
    "out_r160": {"maxnreg": {"output_tok": 160}},
    "out_r168": {"maxnreg": {"output_tok": 168}},
    "out_nocap": {"maxnreg": {}},
    "wy_bwd_r128": {"maxnreg": {"wy_bwd": 128}},
    # float32 inputs (--dtype fp32, TF32 off): exact fp32 FMAs for every dot instead of the
    # default three tf32 products on the tensor cores. sm_90a compiles them to 32 registers and tens
    # of KB of spills a thread (function.TUNE["fp32_dot"]); H200, fifty-seventh session: n_h 1
    # forward 119.4 ms against the default's 6.6
    "fp32_ieee": {"fp32_dot": "ieee"},
    # twelfth session: the token-chunk output kernel in a forward with gradients (per-chunk states,
    # dense query rows, n_h times fewer state tiles read; n_h > 1 only), and dqkwg_bwd's dO H^T on
    # the bf16 tiles as stored
    "tok_out_grad": {"token_chunk_output_grad": True},
    "dqkwg_raw_h": {"dqkwg_raw_h": True},
    "tok_out_raw_h": {"token_chunk_output_grad": True, "dqkwg_raw_h": True},
    "s11_default": {"token_chunk_output_grad": False, "dqkwg_raw_h": False},
    # thirteenth session: every 16-bit storage opt-in at once (A in fp16, Vn and the backward's dH
    # in bf16; the recurrences stay fp32 in registers) -- the nearest this code gets to fla's 16-bit
    # intermediates without changing a kernel: how much of the fwd+bwd gap to fla is storage?
    "all16": {"a_16bit": True, "vn_16bit": True, "dhs_16bit": True},
    # fifty-eighth session (H200, B8 T4096 H16 K=V=128 bf16, torch.profiler per kernel; RESULTS.md
    # "fifty-eighth"): the kernels furthest from fla's counterparts (n_h 2 gated, us, ours / fla:
    # dv_local 510 / 269, wy_bwd 1890 / 998, output_tok 566 / 317). dv_local with P formed once and
    # its V tile 32 columns a step on 2 warps, 3 stages, is the default since (kernel 0.65-0.70x,
    # fwd+bwd 0.972-0.980x); dvl_one_pass is the default before, dvl_l32s4 the runner-up (16- and
    # 64-column steps, 4 warps at 3 stages: 0.975-0.990x fwd+bwd). Lost or mixed, not kept as
    # variants: wy_bwd at (4, 2, 64), (4, 1, 16), (4, 2, 32), (8, 1, 32) (fwd+bwd 1.000-1.200x);
    # wy_bwd (4, 1, 32) 0.995-1.005x (its kernel 0.98x gated, 1.00x ungated); the output kernels
    # at BV 128 (1.008-1.086x), and output_fwd_kernel with P formed once over 32 / 64-column steps
    # (commit d1be03f: its kernel 0.97x ungated, 1.02x gated at n_h 1; "output" also sets the
    # token-chunk kernel's tile, which lost 1.3x at BV 128)
    "dvl_one_pass": {"dv_local": (4, 2, 128), "dv_local_bvl": None},
    "dvl_l32s4": {"dv_local": (4, 4, 128), "dv_local_bvl": 32},
    "wyb_bv32": {"wy_bwd": (4, 1, 32)},
    # around the new default on 2 warps: 4 stages, 16- or 64-column steps
    "dvl_2w_s4": {"dv_local": (2, 4, 128)},
    "dvl_2w_l16": {"dv_local_bvl": 16},
    "dvl_2w_l64": {"dv_local_bvl": 64},
    # (wyb_loop, wyb_loop_s2, wyb_loop_r168: wy_bwd's K-slice passes as range loops, 1.008-1.012x,
    # 1.036-1.049x with a wrong dβ at n_h 2 ungated, 0.989-1.011x on an H200, 2026-12-03; removed)
    # W, U stored by wu_fwd and read by the state kernels (fla's split: W off the serial chain)
    # under today's other defaults; "assoc" won on an H100 on 2026-11-24, before save_states and the
    # lean backward (stored_wu above also turns inv_batched off)
    "wu_stored": {"fuse_wu": False},
    # dqkwg_bwd in two K slices on 4 warps at 2 stages (sm_90a, bf16 n_h 2: 244 registers without
    # spills ungated, 56 B gated, 64 / 56 KiB of shared memory: two programs an SM where the 8-warp
    # default runs one); dqkwg_k2 / dqkwg_k2_4w above are the 8-warp and 3-stage forms
    "dqkwg_k2_4w_s2": {"dqkwg_ksplit": 2, "dqkwg": (4, 2, 32)},
    # around the default since 2026-12-03 (two K slices on 4 warps, 3 stages, V 32 columns a step):
    # the default before (one slice, 8 warps), four slices, 4 stages, 16 / 64 V columns a step
    "dqkwg_k1_8w": {"dqkwg_ksplit": 1, "dqkwg": (8, 3, 32)},
    "dqkwg_k4_4w": {"dqkwg_ksplit": 4, "dqkwg": (4, 3, 32)},
    "dqkwg_k2_4w_s4": {"dqkwg_ksplit": 2, "dqkwg": (4, 4, 32)},
    "dqkwg_k2_4w_bv16": {"dqkwg_ksplit": 2, "dqkwg": (4, 3, 16)},
    "dqkwg_k2_4w_bv64": {"dqkwg_ksplit": 2, "dqkwg": (4, 3, 64)},
    # wy_bwd in 8 K slices of 16 columns (sm_90a, bf16 K=V=128 n_h 2, Triton 3.6: 208 / 255
    # registers ungated / gated, 0 / 32 B of spills, against 255 with 32 / 60 B at 4 slices), with
    # 32 V columns a step (180 / 255, no spills, 54 KiB of shared memory against 72), and capped at
    # 168 registers (three programs an SM instead of two; 64 columns: 188 / 164 B of spills).
    # On 2 warps wy_bwd spills 2.7-5.1 KB a thread (not timed). H200 2026-12-03: all four lost,
    # fwd+bwd 1.050-1.073x, the cap 1.048-1.055x, 32 columns and the cap 1.022-1.031x
    "wyb_k8": {"wy_bwd_ksplit": 8},
    "wyb_k8_bv32": {"wy_bwd_ksplit": 8, "wy_bwd": (4, 1, 32)},
    "wyb_k8_r168": {"wy_bwd_ksplit": 8, "maxnreg": {"output_tok": 160, "wy_bwd": 168}},
    "wyb_k8_bv32_r168": {"wy_bwd_ksplit": 8, "wy_bwd": (4, 1, 32),
                         "maxnreg": {"output_tok": 160, "wy_bwd": 168}},
    # dqkwg_bwd's K slices on a third grid axis, the default before the sixtieth session (now a
    # chunk's slices run next to each other in launch order: H200 fwd+bwd 0.981-0.987x, n_h 1-4)
    "dqkwg_third_axis": {"dqkwg_slices_adjacent": False},
    # the WY backward through dA and A^T dA A^T (wy_bwd.py, with dW in HBM), the default before the
    # sixty-first session's wy_bwd_vn (E from A^T dVn and Vn, wy_bwd_vn.py)
    "wy_bwd_dA": {"wy_bwd_vn": False},
    # wy_bwd_vn_kernel's launch: (num_warps, num_stages, BV) and key slices (default (4, 2, 64), 2)
    "wyvn_k1": {"wy_bwd_vn_ksplit": 1},
    "wyvn_k4": {"wy_bwd_vn_ksplit": 4},
    "wyvn_s1": {"wy_bwd_vn_cfg": (4, 1, 64)},
    "wyvn_s3": {"wy_bwd_vn_cfg": (4, 3, 64)},
    "wyvn_bv32": {"wy_bwd_vn_cfg": (4, 3, 32)},
    "wyvn_w8": {"wy_bwd_vn_cfg": (8, 2, 64)},
    # wy_bwd_vn_kernel under a register cap: 208-250 registers uncapped (sm_90a, K=V=128 bf16, 49
    # KiB shared memory), so 2 four-warp programs an SM; 168 allows 3, 128 allows 4
    "wyvn_r168": {"maxnreg": {"output_tok": 160, "wy_bwd_vn": 168}},
    "wyvn_r128": {"maxnreg": {"output_tok": 160, "wy_bwd_vn": 128}},
    # dqkwg_bwd doing wy_bwd_vn_kernel's work too (FUSE_WY), in 4 K slices (no sm_90a spills), in 2
    # (344 / 644 B a thread at 4 warps), on 8 warps, and in 4 slices over V tiles of 64. H200
    # (2026-12-03, n_h 2, fwd+bwd against the default, ungated / gated): 1.018 / 1.068x (4 slices),
    # 1.064 / 1.106x (2 on 8 warps), 1.165 / 1.278x (V tiles of 64)
    "fused": {"dqkwg_fuse_wy": True, "dqkwg_ksplit": 4},
    "fused_k2": {"dqkwg_fuse_wy": True},
    "fused_k2_w8": {"dqkwg_fuse_wy": True, "dqkwg": (8, 3, 32)},
    "fused_k4_bv64": {"dqkwg_fuse_wy": True, "dqkwg_ksplit": 4, "dqkwg": (4, 2, 64)},
    # state_bwd_fused_kernel (default (4, 1, 64), 255 registers, 2 programs an SM, 256 programs at
    # B8 H16 V=128: one wave): 2 stages (106 KiB shared, 392 B of sm_90a spills), V tiles of 32
    # (512 programs: two waves at 2 an SM) capped at 128 registers (4 an SM, one wave; 528 B).
    # H200 2026-12-04 (n_h 2, fwd+bwd against the default, ungated / gated): 1.079 / 1.076x (2
    # stages), 1.074 / 1.095x (BV 32), 1.187 / 1.206x (BV 32 capped). Its Q, dO and P^T dO loads at
    # the top of the lean step (spills 376 / 504 B) lost too, 1.022 / 1.095x, and were removed
    "sbf_s2": {"state_bwd_fused": (4, 2, 64)},
    "sbf_bv32_r128": {"state_bwd_fused": (4, 1, 32), "maxnreg": {"output_tok": 160, "state_bwd_fused": 128}},
    "sbf_bv32": {"state_bwd_fused": (4, 1, 32)},
    # register caps for one case only (TUNE["maxnreg"] keys with ":ungated"): wy_bwd_vn_kernel at
    # 168 won ungated at n_h 2 on 2026-12-04 (its time 1041 -> 890 us, fwd+bwd 0.975x; sm_90a spills
    # 88 B) and lost gated (1.011x, 280 B); on an H100 (2026-12-07) 0.991-0.992x at n_h 1, 2, 4: the
    # default since. Then dqkwg_bwd (4 warps, 247 registers, 98 KiB shared: 2 programs an SM) on 2
    # stages (65 KiB), alone and with both kernels capped at 168 registers without the gate (3 an
    # SM; 348 B): lost on an H100 (2026-12-07, n_h 2: 1.035 / 1.012x, 1.069 / 1.004x, ungated / gated)
    "wyvn_r168_ungated": {"maxnreg": {"output_tok": 160, "wy_bwd_vn:ungated": 168}},
    "dqkwg_s2": {"dqkwg": (4, 2, 32)},
    "dqkwg_s2_r168": {"dqkwg": (4, 2, 32), "maxnreg": {"output_tok": 160, "dqkwg:ungated": 168,
                                                      "wy_bwd_vn:ungated": 168}},
    # state_bwd_fused storing dH' by TMA from shared memory (no per-chunk conversion of the fp32
    # [128, 64] tile out of the MMA layout): sm_90a loop 1627 -> 1522 instructions ungated, 1837 ->
    # 1721 gated, 48 -> 46 barriers, spills 72 -> 92 B / 136 -> 92 B (sixty-fourth session, untimed)
    "sbf_tma_dh": {"state_bwd_tma_dh": True},
    # state_fwd_fused storing its per-chunk states the same way (a forward with gradients, or n_h =
    # 1): loop 1132 -> 1065 instructions ungated, 1337 -> 1243 gated, shared memory 92 -> 108 KB
    "sf_tma_hs": {"state_fwd_tma_hs": True},
    "tma_states": {"state_bwd_tma_dh": True, "state_fwd_tma_hs": True},
    # the per-sub-step rows by TMA as well, where every chunk is full: Vn in the forward (loop
    # 1132 -> 1058 / 1337 -> 1211, 108 KB shared; with the states too it needs 125 KB, one program
    # an SM, so not combined) and A^T dVn in the backward (with dH': loop 1627 -> 1517 / 1837 -> 1558,
    # spills 72 -> 32 B / 136 -> 0 B)
    "sf_tma_vn": {"state_fwd_tma_vn": True},
    "sbf_tma": {"state_bwd_tma_dh": True, "state_bwd_tma_x": True},
    "tma_rows": {"state_bwd_tma_dh": True, "state_bwd_tma_x": True, "state_fwd_tma_vn": True},
    # the state backward forming P^T dO itself, no dv_local launch (320 / 334 us at n_h 2 on an H200)
    # and no fp32 [Ls, H, V] write and read for it; but two more dots a chunk in a kernel at 255
    # registers: sm_90a spills 72 -> 584 B ungated, 136 -> 440 B gated (with the TMA stores 424 /
    # 288 B), loop 1627 -> 2046 / 1837 -> 2686 instructions
    "sbf_local_dv": {"state_bwd_local_dv": True},
    "sbf_local_dv_tma": {"state_bwd_local_dv": True, "state_bwd_tma_dh": True, "state_bwd_tma_x": True},
    # dqkwg_bwd's dk tile by TMA where every chunk is full (2488 -> 2400 instructions gated); with the
    # state kernels' row stores
    "dqkwg_tma_dk": {"dqkwg_tma_dk": True},
    "tma_all": {"state_bwd_tma_dh": True, "state_bwd_tma_x": True, "state_fwd_tma_vn": True,
                "dqkwg_tma_dk": True},
    # H100 2026-12-07 (sixty-fifth session, n_h 1 / 2 / 4): the state kernels' TMA stores won gated
    # (Vn 0.983-0.991x fwd+bwd, dH' and A^T dVn 0.993-0.997x) and H ungated (the kernel 0.98-0.99x);
    # wyvn_r168_ungated 0.991-0.992x. Defaults since: this is the default before them
    "s64_default": {"state_bwd_tma_dh": False, "state_fwd_tma_hs": False, "state_fwd_tma_vn": False,
                    "state_bwd_tma_x": False, "maxnreg": {"output_tok": 160}},
    "no_state_tma": {"state_bwd_tma_dh": False, "state_fwd_tma_hs": False, "state_fwd_tma_vn": False,
                     "state_bwd_tma_x": False},
}
# (inv_kslice, tri_inv64's Gram blocks summed over key slices, lost on an H200 on 2026-11-26 at
# every n_h, 1 to 4 warps: fwd 1.03-1.71x, fwd+bwd 1.00-1.14x; removed, TUNING.md)
# (dqkwg_o1_dqh and state_small, 0.871x gated fwd+bwd on an H100 on 2026-11-25, are the kernels now)
DEFAULT_VARIANTS = ["default", "per_chunk_fp32vn", "per_chunk", "fp32vn"]
