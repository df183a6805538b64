#!/usr/bin/env bash
# The GPU checks and timings still owed to the open issues, in priority order, one stage per
# device call (each fits the 10-minute limit). On the lent GPU machine, from the repo root:
#   source tools/device_setup.sh && bash tools/gpu_owed.sh STAGE
# Suggested order (written 2026-11-27, twentieth session). Everything the nineteenth owed ran on
#   H100s in the twentieth: compute-sanitizer memcheck of lookback4_bwd 0 errors; the m = 4 rule
#   timed over its band (now below 1.4 ring programs per SM); tests/test_kernels_lookback4.py 41
#   and test_gpu_models.py 67 passed with the final routing. Nothing is owed.
#   Twenty-first session: the time-contiguous m = 1 kernels (time_major.py, diagonal_scan
#   time_dim=2) ran every test, memcheck and timing on H100s (stages tmaccel, pytest, memcheck).
#   What the twentieth found (RESULTS.md): at B8 T2048 N768 the m = 4 and m = 8 passes are bound
#   by their chain of 2048 steps (B16 T1024, the same bytes, reaches 93-94 %); smaller block
#   groups, deeper pipelines, time chunks and whole blocks in one thread (commit 80dbcc4) lost.
#   Twenty-fourth session (H100, one H200 call): the m = 2, 4 TMA forwards (tma_blocks.py) and
#   backward (tma_blocks_bwd.py) ran tune, scan, memcheck (0 errors) and their tests.
#   Twenty-fifth session (H100 only: two calls for nvidia-h200 got H100s): the m = 4 TMA backward
#   became the default after the TMA forward (bd_tma_bwd_config); everything it owed ran (-k
#   block_tma 18 + 32 passed, lookback2/4 files 87 passed, test_kernels_tma_blocks.py 38 passed on
#   the final source, memcheck 0 errors). Twenty-sixth (H100 only again): the TMA backward's scan on
#   the reversed tile and the state carries (tma<m>_bwd_flip, _carry_mu, tma<m>_carry_h) ran tune,
#   scan, memcheck (0 errors), test_kernels_tma_blocks.py (40) and -k block_tma (18). Owed: the
#   m = 4 rules on an H200 (the tile-length threshold P = 2.4 and the three knobs), e.g.
#     TUNE_ARGS="--m 4 --bwd --shapes 5x2048x768 7x2048x768 8x2048x768 11x2048x768 --tune old=tma4_bwd_flip:false+tma4_bwd_carry_mu:false+tma4_carry_h:false b32=tma4_bwd_bt:32 b16=tma4_bwd_bt:16" tune
#   and the rest of tests/gpu -k tma (m = 1 rows, unchanged since they last passed: call 4 stopped
#   at 65 of 138 with no failure).
#   Twenty-seventh (H100 only): m = 16 backward stages by programs per SM and the m = 8 gather ring
#   (fwd.py GATHER) became defaults. Twenty-eighth (H200 calls 1-2, H100 calls 3-5): everything the
#   twenty-seventh owed ran (scan stage on the H100: m = 8 83.7 / 60.6 %; -k "ring_gather or
#   v1_stages" 41 passed; the H200 m = 4 rules: bd_tma_bwd_config now draws its line at P = 3.1 on
#   an H200, from B8 / B9 / B10 timings). Twenty-ninth (H200 calls 1-3, 5; H100 4, 6): the 3.1
#   line ran on an H200 (the default took the faster tile at B8 and B9); the torch.compile ops now
#   make the eager plans (kernels/block_diagonal/plan.py): tests/gpu/test_gpu_compile.py and
#   tests/test_ecosystem.py -k "custom_op or plans or before_register" 28 passed on the H100 with
#   the final code; compiled = eager within 1 % (tune_compare.py --compiled). Nothing is owed.
#   Thirty-fourth (H200): 71 of the 121 block-diagonal GPU checks since the thirty-third
#   session's m = 1 TMA row; thirty-fifth (H200): the other 50 passed through
#   tools/gpu_suite_resume.sh (two calls, the Triton cache carried). Nothing is owed. The m = 1
#   lead of the thirty-fourth (tile variants with more warps per SM) lost warm and cold; the
#   gap to accelerated-scan on (B, T, N) is the walk over the layout (tools/walk_order_probe.py,
#   RESULTS.md "thirty-fifth"): run it again with, e.g.,
#     python3 tools/walk_order_probe.py --out $OUT/w --flush-l2 256 \
#       --walks btn:32x64x2 btn:32x64x2x4 bnt:1024x1x4 --shapes 8x2048x4096
#   Thirty-sixth (H200, 8 calls): the thirty-fifth's leads ran and became defaults: 16-step
#   m = 1 tiles in the wave-tail bands (now scan._DIAG_BANDS), 16-byte loads on rows with
#   N % 4 == 0 (NV, _host.row_divisor; the N4104 loads were scalar, PTX-confirmed), TMA only
#   on 64-byte rows, m = 8 ring2 bands (now scan._VARIANT_BANDS). Their GPU tests passed. Leads:
#   Thirty-seventh (H200, 4 calls): those leads ran and became defaults in one pair of band
#   tables (scan._DIAG_BANDS for the m = 1 tiles, scan._VARIANT_BANDS for m >= 2 variants,
#   read by _host.device_band): m = 1 backward 64 x 32 at (4, 4.75] and 16 x 64 on 2 warps at
#   (6, 7.5] programs per SM (B9 0.994x, B13 0.995x accelerated-scan fwd+bwd); m = 16 forward
#   ring2 at (8, 14], g4 at (16, 20] (B5 101 %, B9 100 %); m = 8 backward v1 at (16, 20].
#   test_wave_tail_bands (14) passed. The m = 1 look-back (NV) and time-major (TV) kernels load
#   16-byte vectors on rows that are a multiple of 4 (B8 N776 fwd+bwd 0.80x accelerated-scan,
#   was 0.66x; time-major T4104 forward 100 % of copy, was 52 %); test_diag_unaligned_rows
#   (24) and test_time_major_unaligned_rows (8) passed. OWED on a GPU (call 8 ran out of time):
#     python3 -m pytest tests/test_kernels_lookback.py -k "backward_auto_rule or many_tiles"
#   (the rule test now patches 4 SMs in; the two many-tiles forwards at 128 x 32 / 128 x 4 were
#   not reached; the other 33 passed with the NV change). Leads left: the time-major backward at
#   T4100 / T4104 (78 % against 96.5 % at T4096; not its tile length, call 7); the m = 1
#   forward at few programs on unaligned rows (B8 N776 0.80x); the m = 1 forward below
#   accelerated-scan (0.917-0.97x at B5-B7, the (B, T, N) walk); bf16 in the bands (not
#   timed); the NV alignment for m >= 2 (only rows H * m not a multiple of 16, e.g. m = 2 with
#   odd H: check PTX on the CPU first, tools/aot_check.py --ptx-dir), e.g.
#     python3 tools/tune_compare.py --m 16 --rounds 2 --out $OUT/f16 --tune old=variant:ring4 \
#       --shapes 5x2048x4096 9x2048x4096
#   Thirty-eighth (H200, 8 calls): the owed look-back tests passed (10). The time-major rest
#   past the last whole tile runs in one short tile (Nsight Compute: the masked tile was 1.47x
#   the backward's instructions; T4104 fwd+bwd 87 -> 90 % of copy). bf16 m = 1 (new --dtype in
#   tools/diag_tile_vs_accel.py and tools/tm_vs_accel.py): the TMA row for 16-bit inputs
#   (tma._MANY_16BIT_BY_DEVICE, also in the fp32 band) and 4096-step time-major tiles; tests
#   passed (test_kernels_tma / time_major on the GPU 48, -k time_major 17, test_diag_tma bf16 2).
#   Thirty-ninth (H200, 9 calls): 16-bit m = 1 tiles load 4 channels a lane (_host.diag_vec:
#   tile and look-back forwards and the look-back backward; the tile backward on tiles of <= 32
#   steps with <= 4 programs an SM); tests passed (test_kernels_diag_vec 9, bf16 unaligned rows / bands 15 + 6, full size).
#   accelerated-scan's backward reads past its states where T % 2048 != 0 (its GPU faults at
#   T1024; tools/accel_reads_past.py): the tools skip its backward there. Nothing owed. Leads:
#   the bf16 TMA forward (0.76-0.88x accelerated-scan at B4-B12 T2048 N4096), bf16 at few
#   programs (B8 N768 0.57x; B1 T16384 N768 0.41x), 8-chunk windows for the look-back
#   backward only (lb_window 8 sped fwd+bwd 6-7 % but slowed the forward); time the final
#   look-back default once (its capped backward was timed as diag_vec_bwd:4), e.g.
#     python3 tools/diag_tile_vs_accel.py --out $OUT/d --rounds 3 --configs default \
#       --flush-l2 256 --dtype bfloat16 --tune old=diag_vec:0 w8=lb_window:8 \
#       --shapes 1x16384x768 2x16384x768 8x2048x768
#   Fortieth (H200, 8 calls): the look-back default was timed (B1 / B2 T16384 N768, call 6) and
#   backward-only windows (lb_bwd_window) lost; the many-program TMA rows became bands of
#   programs an SM (tma._MANY_BY_DEVICE: fp32 one-warp 16 x 64 at 2-2.55 (4 stages) and 3.3-3.8
#   (3 stages), bf16 16 x 128 from 4.2 or 3.8 at T >= 8192); tests passed (test_kernels_tma +
#   diag_vec 27, test_diag_tma new rows 4). Forty-first (H200, 8 calls): the owed 3-stage row
#   passed (test_kernels_tma 18, test_diag_tma cfg8 2); the 3-stage band now runs to 4 an SM
#   (B8 T2048 N4096 forward 0.955 -> 0.971x accelerated-scan) and bf16 takes one-warp 32 x 64
#   tiles at 2.9-4.2 (B8 T2048 0.82 -> 1.02x); test_kernels_tma 19 and test_diag_tma cfg9 2
#   passed with the final rows. Nothing owed. Leads: bf16 B5 T2048 N4096 (0.76x forward; it
#   takes as long as B6, a step that the program count does not explain: profile it with Nsight
#   Compute against B4 and B6); bf16 at 4-4.4 an SM (B17 N2048 0.77x, with 3 stages 0.80-0.81x
#   in two calls; B33 N1024 0.987x, 3 stages 1.017x; B9 0.86x on 16 x 128), e.g.
#     python3 tools/diag_tile_vs_accel.py --out $OUT/b --rounds 3 --configs default --flush-l2 256 \
#       --dtype bfloat16 --tune e3=diag_tma:true+tma_bt:32+tma_bn:64+tma_nw:1+tma_ns:3 \
#       --shapes 17x2048x2048 9x2048x4096 33x2048x1024
#   Forty-second (H200, 11 calls): both leads ran. bf16 32 x 64 tiles take 3 stages from 3.45 an
#   SM (B17 0.80x, B33 1.02x); B5's profile (ncu_m1.py --dtype bfloat16 --shape 4x.. 5x.. 6x..):
#   its 640 programs do not run in step (4.06 warps an SM against 4.85 placed), not closed. The
#   m = 32 backward takes v1 at (0.9, 1.85] and (7, 8] an SM (B8 N768 fwd+bwd -4.4 %, N4096
#   -2.4 %); test_kernels_tma 20, test_diag_tma cfg9/cfg10 4, test_wave_tail_bands m = 32 4
#   passed. Nothing owed. Leads: m = 16 fwd+bwd at B8 N4096 on the H200 59.0-59.5 % (target 60;
#   ring2 / ring4 / g4 / 2-4 stages / bh 2 were slower); B10 N4096 m = 32 v1 -4.5 % in one call
#   (left out between B9 +2.5 % and B11 -0.8 %); an even work share per SM for the bf16 B5 case
#   (16-channel tiles, 9.7 programs an SM, were slower: 0.71-0.73x against 0.76x, call 11).
#   Forty-third (H200, 8 calls): fusedcomp ran (the unfused GPU test passed; fused 2.50x / 2.34x
#   met). New companion / fused launch rules (tools/gate_tune_compare.py): companion coefficients
#   m = 4 / 8 now 2.01x / 4.00x (at their targets), fused m = 2 0.85x -> 1.87x;
#   test_gpu_fused_companion.py 42 passed (poisoned). Nothing owed. Leads: the companion rules on
#   an H100 (fusedcomp there), and time-chunked companion kernels for margin above m/2.
#   Forty-fourth (H200, 10 calls): fusedcomp ran (45 passed poisoned, companion m = 32 / 64
#   included; coefficients 2.03x / 4.03x at m = 4 / 8). The m >= 2 backward on fewer warps
#   (scan._bwd_warps: 1 at mp 16, 2 at mp 32): m = 16 fwd+bwd B8 N4096 61.7 % (target met on
#   the H200), N768 56.8 %; its GPU tests passed (-k "backward_warps or ... (16 or 32)", 30).
#   Leads: the m = 16 backward's g4 at 1 warp (faster at B8 / B12 / B16, slower at
#   B9; no clean band yet); fused gates at m = 16 / 32 (fewer backward warps lost, call 8; B1
#   T16384 m = 16 fwd+bwd runs at 3 % of copy, 25.6 ms). bdlru_scan's auto now takes the unfused
#   path for few long fp32 sequences (fused_gates.unfused_faster, call 10). OWED: stage unfused
#   (its GPU test, and fused against unfused at B1-B4 T2048 / T4096 around the line).
#   Forty-fifth (H200, 11 calls): everything the forty-fourth owed ran (test_gpu_fused_companion.py
#   46 passed poisoned at 1e-5 / 5e-3; stage unfused). The unfused route's lines are now by block
#   size and by whether a backward follows (fused_gates.UNFUSED_LINES, m = 2..32) from eager and
#   graph timings (gate_tune_compare.py --route --eager); -k unfused 7 passed on the final lines,
#   test_gpu_models.py + test_gpu_compile.py 85 passed (before the forward lines). Nothing owed.
#   Leads: the unfused route's host work (1.0-1.8 ms a fwd+bwd at B1, tools/host_overhead.py
#   --bdlru unfused; it varied 2x between machines); an H100 run of stage unfused.
#   Forty-sixth (H200, 5 calls): time-chunked fused-gate passes (fused_gates/chunked.py, rule
#   choose_chunk, m = 2..16; tl.dot summaries from m = 9); their GPU tests passed (62, 21, 7).
#   Forty-seventh (H200, 5 calls): everything the forty-sixth owed ran: stage chunked's tests
#   (84 + 16 passed over calls 2-3), the companion chunks timed (rule companion.choose_chunk,
#   RESULTS.md "forty-seventh"), test_gpu_compile.py 22 passed (fused and companion compiled
#   chunks). Nothing owed. Leads: m = 16 companion summaries (B1 T4096 chunks tie the one
#   pass), the chunked passes' eager launches (about 0.6 ms a fwd+bwd), companion m = 8 at
#   batch 1 (2.8x dense, target 4x).
#   The compiled timings again, e.g.
#     TUNE_ARGS="--m 4 --bwd --compiled --shapes 8x2048x768 --tune ring=bd4_tma:false+bd4_lookback:false+bd4_bwd_lookback:false" tune
#   Any TUNE setting against the default, one m (stage tune, tools/tune_compare.py):
#     tools/gpu_pair.sh "TUNE_ARGS=--m,4,--bwd,--shapes,8x2048x768,--tune,off=bd4_bwd_lookback:false tune" ""
#   Leads for issue 3, each to be timed against the default in one call (tools/lb2_compare.py
#   times the m = 2 look-backs, tools/lb4_compare.py the m = 4 ones; stages lb2, lb4 below):
#     the m = 1 look-back rule, repeated where it was chosen (B1/B2/B8 N768, B8 N4096):
#     tools/gpu_pair.sh "LBR_SET=rule LBR_ROUNDS=3 lbrepeat" ""
#   The forward's m = 8 pass at B8 N768 is bound by the program (README.md "Few programs"):
#   the cp.async forward and tile2.py were slower and are in commit 498dacb only.
#   The delta cache filter below matched 1013 entries (45 MiB) in the fourteenth session: not saved.
#   A stage's kernels can be compiled on the CPU machine before the first call (seventieth session):
#   tools/jit_cache.py build ... -- tools/jit_cache_runs.py STAGE, then pack into .triton_cache and
#   carry it (the tool's docstring; `python3 tools/jit_cache.py keyinfo` must match on the device).
#   Carry the Triton cache between calls
#   (tools/triton_cache.sh: rm -rf .triton_cache && mkdir .triton_cache && cp
#   FILES_AT/triton_cache.tar.gz* .triton_cache/, then carry [".whl", ".triton_cache"]); with it
#   deltafla at n_h 1-4 took about 240 s (cold: more than 530 s). Narrow what is saved with
#   TRITON_CACHE_ONLY (a regex over entry file names, e.g. "dqkwg|wy_|state_|output_|tri_inv|
#   dv_local|chunk_|l2norm" for the delta stages) when the archive would pass 45 MiB.
#   Sixty-third and sixty-fourth sessions: no machine. Sixty-fifth (2026-12-07, H100, 5 calls): all
#   they owed ran (test_gpu_delta 62 passed; deltaab of the MMA-layout tails: dqkwg kept, wy_bwd_vn
#   undone; the TMA opt-ins and the wy_bwd_vn:ungated cap timed at n_h 1, 2, 4 and made defaults
#   where they won; 63 passed after). Sixty-sixth (2026-12-07, H100, 7 calls): everything owed ran
#   (the three token-chunk forward rows passed; test_gpu_delta 70 passed; ours against fla at n_h
#   1-4 gated and not: fwd 0.796-0.926x, fwd+bwd 0.874-0.966x). Nothing is owed. fla 0.6.0 keeps
#   its autotune choices in the Triton cache (FLA_CACHE_RESULTS, default on: a
#   <kernel>.autotune.json per kernel); a cold deltafla at n_h 2 used 440 s, the same with the
#   cache 50-100 s. So end the first fla call with
#     TRITON_CACHE_ONLY="autotune|chunk_|solve_tril|merge_|recompute_|prepare_wy|l2norm|dqkwg|wy_bwd|state_|output_|tri_inv|dv_local|wu_fwd" \
#       bash tools/triton_cache.sh save
#   and carry it (about 33 MiB in 3 parts with our kernels and fla's), so that later calls skip
#   fla's tuning.
#   A delta variant against fla in one process (ratios to both):
#     DELTA_TESTS=0 DELTA_VAR_FLA=1 DELTA_VARIANTS=default,NAME DELTA_NH=1,4 deltavar
#   On an nvidia-h100-x2 machine run timings on one GPU and tests or training on the other:
#   tools/gpu_pair.sh "<card 0 stages>" "<card 1 stages>" (the seventh to thirteenth sessions' calls:
#   gpu_runs/s7_call* to s13_call*, not in git). The eighth to tenth sessions' numbers are
#   H200's, the seventh's and eleventh to thirteenth's H100's: rerun baselines in the same call.
# STAGE: tests    — GPU correctness owed: the whole tests/gpu suite in one session. The third session
#                   of 2026-11-25 (H100) passed test_gpu_models 67, test_gpu_fused_companion 32,
#                   test_gpu_compile 10, test_gpu_delta 8, test_gpu_l2norm 9, test_gpu_block_diagonal
#                   -k "diag_tiles or diagonal_api" 7 (+1 xfail, since explained: the input, not the kernel); the fourth passed the T = 65536 and
#                   2^31 tests (-k "long_chunked or 2_31 or diagonal_api_long": 5 passed, 50 s). The
#                   rest of test_gpu_block_diagonal (full_size, forward_variants, backward_ring: ~40
#                   compilations) needs more than 230 s. Run the T = 65536 tests one process at a
#                   time: their fp64 references take tens of GB; under pytest-xdist (-n 3/4) tests
#                   failed with OutOfMemoryError
#        pytest   — any test files in one process: PYTEST_FILES (commas through gpu_pair.sh), PYTEST_K
#        tests2   — test_gpu_models, test_gpu_compile, test_gpu_fused_companion (all passed on 2026-11-25,
#                   H100; test_gpu_compile needs about 260 s)
#        lookback — issue 3: m = 1 look-back forward and backward (both "auto" defaults) vs the
#                   tiled/chunked paths (tools/lookback_repeat.py has CUDA-graph timings)
#        lbrepeat — issue 3: tools/lookback_repeat.py (LBR_SET default|rule, LBR_ROUNDS)
#        lb2      — issue 3: tools/lb2_compare.py (m = 2 look-back forward: GPU checks, then timings
#                   against the ring / chunked forward and the default; LB2_ROUNDS)
#        tune     — issue 3: tools/tune_compare.py, any TUNE settings against the default for one m
#                   (TUNE_ARGS, TUNE_ROUNDS)
#        delta    — issue 4: the delta defaults against fla in one run (fwd, n_h 1-4, gated/ungated)
#        deltaprof — issue 4: per-kernel times (torch.profiler) of one fwd+bwd at n_h 1 and 4
#        ncudelta — issue 4: Nsight Compute counters of the delta backward kernels (tools/ncu_delta.py)
#        deltafp32 — issue 4: float32 inputs: the fp32 GPU checks and the timing of TUNE["fp32_dot"]
#                   "tf32x3" (default) against "ieee" (DELTA_NH, default "1 2"; ieee compiles
#                   for minutes: on 2026-12-03 n_h 1 alone took a cold 600 s call)
#        deltavar — issue 4: tests/gpu/test_gpu_delta.py (66 tests since the sixty-fifth session;
#                   45 of them: 169 s warm on an H200 in the fifty-eighth session, 87 s in the
#                   sixtieth; cold, after a default changed, 44 of them took the
#                   fifty-ninth's 250 s TEST_TIMEOUT: keep the default 320), then
#                   delta_throughput.py --variants against the default
#                   at DELTA_NH (default "2 4"). Default list: the eleventh session's defaults
#                   (s11_default) and the opt-ins left off after the ninth to twelfth sessions'
#                   timings (dhs16, reload_k_always); DELTA_VARIANTS picks others (the register caps
#                   inv_r128, inv_r96, wy_bwd_r168, wy_bwd_r128 lost on an H100 in the eleventh)
#        deltaab  — issue 4: the working tree's delta kernels against older copies of some of them
#                   in one call, new / old / new (AB_DIR, default ab_prev: files named as in
#                   kernels/delta_product/, e.g. `git show REV:kernels/delta_product/X.py >
#                   ab_prev/X.py`; untracked files travel to the device, .git does not), fwd+bwd at
#                   DELTA_NH (default 2), each kernel's time with DELTA_KERNELS=1
#        memcheck — issues 3, 4: tools/memcheck_kernels.py under compute-sanitizer --tool memcheck with
#                   the caching allocator off (any out-of-bounds access of any kernel, fwd+bwd)
#        bdrest   — issue 3: test_forward_variants, the block-diagonal GPU tests not yet run with x = I x0
#        deltafla — issue 4: ours vs fla, fwd and fwd+bwd, one run (DELTA_NH, default "1 2 3 4")
#        sumthread — issue 3 (OWED, sixty-seventh session): the GPU rows of the thread chunk summaries
#                   (test_summary_thread_chunked: m = 3, 4, 5, 8, 64- and 256-step chunks, fp32 / bf16,
#                   varlen, near-orthogonal transitions; test_more_than_2_31_elements[520-8-tune1]),
#                   then the H200's B1 rows (scan_throughput.py --shapes 1x16384x768); pytest -v so
#                   that a cut-off run still shows which rows passed. Sixty-eighth session (H100): the
#                   m = 3, 4, 5 rows passed (64 and 256); the m = 8 rows and 520-8 are still owed
#                   (each row compiles cold for about 50 s: carry .triton_cache or give it 300 s); and
#                   test_long_chunked_varlen[4], which now routes m = 4 through the thread summaries
#        rerun    — issue 3 (OWED, sixty-eighth session): the opt-in TUNE['rerun_len'] (the chunked
#                   forward's re-run over k summary chunks, summary.rerun_factor) against the default,
#                   m = 4, 8 forward and m = 8 fwd+bwd at B1 T16384 / T65536 N768, after its GPU test
#                   (test_rerun_over_summary_chunks: m = 4, 6, 8, T65536 varlen); then the padded-row
#                   backward at many programs (m = 6 ring4 spills 432 B on sm_90a: ring2, v1 + gather)
#        lbthread — issue 3 (OWED, sixty-ninth session): lookback_thread.py, the opt-in single pass
#                   with one block per thread (TUNE bd_lookback + bdlb_kind 'thread'): its GPU race
#                   test (m = 4, 6, 8; 8- and 32-step tiles; repeated), then the B1 T16384 N768
#                   and B8 T2048 N768 forwards against the default in 8- to 64-step tiles, and
#                   the forward walk (lbt_walk) in 16 / 32 (B8:
#                   the ring's chain of 2048 steps, 68 % of copy on an H200); a default only if it wins
#        ncubytes — issue 4: DRAM bytes read / written and time of each of the seven delta kernels of
#                   one fwd+bwd (Nsight Compute counters instead of byte estimates; NCU_NH, NCU_GATED)
#        layers   — issue 7: layer targets in bf16
#        scan     — issue 3: the full scan_throughput.py run (fwd+bwd under the new chunk rule)
#        sweep    — issue 3: tools/fwdbwd_chunk_sweep.py (chunk choices with gradients; SWEEP_SET=summary
#                   SWEEP_FWD=1 SWEEP_M=8,16,32 SWEEP_SHAPES=1x16384x768: the tensor-core chunk summaries)
#        train    — issue 6: TRAIN_CONFIG=mad_tasks/configs/<name>.json (gpu_tables_next7.json: long schedules
#                   in "pause" mode, continued over several calls, see the stage; default gpu_tables_next6.json, which ran
#                   on 2026-11-25: mad_tasks/RESULTS.md section 8). Still owed: S4 (3k), the Table 4 baselines
#                   (DeltaProduct, DeltaNet, LSTM) at S4/S5 over seeds, the MAD configurations beyond the
#                   baseline. Steps do not wait for the GPU: 4.6 ms/step alone, 5.0 with 4 processes
#                   (H100, tools/train_step_time.py)
#        diagtile — issue 3: m = 1 forward tiles (the H100 default (16, 64, 2) since 2026-11-25) against
#                   accelerated-scan in one run, tools/diag_tile_vs_accel.py, after the GPU tile tests
#        tmaccel  — issue 3: the time-contiguous m = 1 scan against accelerated-scan (tools/tm_vs_accel.py)
#        bhsweep  — issue 3: tools/fwd_bh_sweep.py for m = 4 and the B1 T16384 chunk rows (2026-11-25 ran
#                   m = 2 at B8 T2048 only: the default block group won)
#        fusedcomp — issue 3: tests/gpu/test_gpu_fused_companion.py, then benchmarks/fused_companion_throughput.py,
#                   the fused-gate (>= 2x softmax + scan, m 4, 8) and companion (>= m/2x) targets
#                   (last run: H200, forty-fourth session)
#        unfused  — issue 3: bdlru_scan's unfused route for few long fp32 sequences (last run: H200,
#                   forty-fifth session): tests/gpu/test_gpu_fused_companion.py -k unfused, then the fused
#                   kernels against the unfused path at shapes around fused_gates.unfused_faster's line
# Logs and result files go to $OUT (or ./gpu_out); rows are appended to $OUT/RESULTS_<stage>.md
# so they can be reviewed before they are merged into benchmarks/RESULTS.md. Every stage ends by
# writing $OUT/triton_cache.tar.gz: copy it to .triton_cache/ here and carry ".triton_cache" in the
# next call, which then skips recompiling unchanged kernels (tools/triton_cache.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1  # a stage cut by its timeout still leaves its progress in the logs
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
stage=${1:?usage: gpu_owed.sh ncu|ncudelta|memcheck|bd|bdrest|deltafla|deltaprof|deltafp32|tests|tests2|lookback|delta|deltavar|deltaab|layers|scan|sweep|diagtile|tmaccel|bhsweep|fusedcomp|unfused|chunked|train}
case "$stage" in
  tests)
    # one pytest process per file: a CPU test module must not switch the interpreter on for the rest
    for t in "tests/test_kernels_lookback.py -k 'gpu or auto or backward'" tests/gpu/test_gpu_delta.py \
        "tests/gpu/test_gpu_models.py -k delta" tests/gpu/test_gpu_l2norm.py \
        "tests/gpu/test_gpu_block_diagonal.py -k 'more_than_2_31_elements or backward_ring'" \
        tests/gpu/test_gpu_block_diagonal.py; do
      echo "=== pytest $t" | tee -a "$OUT/tests.log"
      eval timeout ${STAGE_TIMEOUT:-560} python3 -m pytest -q -rfEs -p no:cacheprovider "$t" 2>&1 | tee -a "$OUT/tests.log" | tail -15
    done ;;
  pytest)
    # any GPU test files in one process: PYTEST_FILES (comma-separated through gpu_pair.sh), PYTEST_K
    # an optional -k expression (commas become spaces: PYTEST_K=full_size,or,l2norm)
    timeout ${STAGE_TIMEOUT:-500} python3 -m pytest -q -rfEs -p no:cacheprovider ${PYTEST_FILES:?PYTEST_FILES} \
      ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee -a "$OUT/pytest.log" | tail -15 ;;
  tests2)
    for t in tests/gpu/test_gpu_models.py tests/gpu/test_gpu_compile.py tests/gpu/test_gpu_fused_companion.py; do
      echo "=== pytest $t" | tee -a "$OUT/tests2.log"
      timeout ${STAGE_TIMEOUT:-300} python3 -m pytest -q -rfEs -p no:cacheprovider "$t" 2>&1 | tee -a "$OUT/tests2.log" | tail -15
    done ;;
  lookback)
    timeout ${STAGE_TIMEOUT:-560} python3 benchmarks/scan_throughput.py --lookback-compare --out "$OUT" \
      --results "$OUT/RESULTS_lookback.md" 2>&1 | tee "$OUT/lookback.log" | tail -40 ;;
  lb2)
    # issue 3: the m = 2 look-back forward (lookback2.py) against the default, GPU checks first
    # LB2_ARGS: e.g. "--bwd --no-check" (fwd+bwd: the look-back backward forced, off and by the rule)
    timeout ${STAGE_TIMEOUT:-560} python3 tools/lb2_compare.py --out "$OUT" --rounds ${LB2_ROUNDS:-3} ${LB2_ARGS:-} \
      2>&1 | tee "$OUT/lb2.log" | tail -40 ;;
  lb4)
    # issue 3: the m = 4 look-back forward (lookback4.py, opt-in) against the default, GPU checks
    # first; LB4_ARGS: e.g. "--bwd --no-check", "--shapes 8x2048x768"
    timeout ${STAGE_TIMEOUT:-560} python3 tools/lb4_compare.py --out "$OUT" --rounds ${LB4_ROUNDS:-3} ${LB4_ARGS:-} \
      2>&1 | tee -a "$OUT/lb4.log" | tail -40 ;;
  tune)
    # issue 3: any scan.TUNE settings against the default for one m (tools/tune_compare.py);
    # TUNE_ARGS e.g. "--m 4 --bwd --shapes 8x2048x768 --tune bh4=bh:4+num_warps:1" (through
    # gpu_pair.sh: commas for spaces); appends to tune.log, JSONs tune_compare_m<m>[_bwd].json
    timeout ${STAGE_TIMEOUT:-560} python3 tools/tune_compare.py --out "$OUT" --rounds ${TUNE_ROUNDS:-3} ${TUNE_ARGS:?TUNE_ARGS} \
      2>&1 | tee -a "$OUT/tune.log" | tail -20 ;;
  lbrepeat)
    # m = 1 look-back configurations in interleaved rounds (tools/lookback_repeat.py): LBR_SET
    # (default|rule), LBR_ROUNDS
    timeout ${STAGE_TIMEOUT:-560} python3 tools/lookback_repeat.py --out "$OUT" --set ${LBR_SET:-default} \
      --rounds ${LBR_ROUNDS:-5} 2>&1 | tee "$OUT/lbrepeat.log" | tail -40 ;;
  memcheck)
    # one sanitizer process per family, all at once (2026-11-25: all six families in 374 s this way;
    # 0 errors everywhere). FAMILIES narrows it, MEMCHECK_CASE (a substring of the case names) too
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)   # 2026-11-25: there
    for f in ${FAMILIES:-block_diagonal diagonal fused_gates companion delta l2norm}; do
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${STAGE_TIMEOUT:-500} "$cs" --tool memcheck \
        --print-limit 30 python3 tools/memcheck_kernels.py --family $f ${MEMCHECK_CASE:+--case $MEMCHECK_CASE} \
        > "$OUT/memcheck_$f.log" 2>&1 &
    done
    wait
    tail -n 12 "$OUT"/memcheck_*.log ;;
  bd)
    # issue 3: the whole block-diagonal GPU file in two halves, one per card (one process: the
    # T = 65536 references take tens of GB). BD_PART=1: full_size, long_chunked_varlen,
    # diagonal_api_long, more_than_2_31_elements; BD_PART=2: forward_variants, backward_ring,
    # diag_tiles (23-25 s a row cold on an H200, tenth session: each half needs more than 500 s
    # without a carried Triton cache); BD_PART=3: the rows the tenth session's limits cut (2^31
    # elements, ring8 forward, backward ring, m = 1 tiles). -v: a timed-out run still shows which
    # rows passed; --durations for the next plan
    case "${BD_PART:-1}" in
      1) k="full_size or long_chunked or diagonal_api_long or 2_31" ;;
      2) k="forward_variants or backward_ring or diag_tiles" ;;
      *) k="2_31 or (forward_variants and ring8) or backward_ring or diag_tiles" ;;
    esac
    timeout ${STAGE_TIMEOUT:-500} python3 -m pytest -v -rfEs -p no:cacheprovider --durations=60 \
      tests/gpu/test_gpu_block_diagonal.py -k "$k" 2>&1 | tee "$OUT/bd${BD_PART:-1}_tests.log" | tail -40 ;;
  bdrest)
    # block-diagonal GPU tests not yet run with the ring forward's x = I x0 start: full_size (all m,
    # fp32 and bf16) and long_chunked_varlen (m = 1, 2, 4, 8, 16) passed on 2026-11-25 (fifth and sixth
    # sessions), forward_variants ring2 m = 1, 2, 4 too; the rest of forward_variants is left
    timeout ${STAGE_TIMEOUT:-500} python3 -m pytest -q -rfEs -p no:cacheprovider tests/gpu/test_gpu_block_diagonal.py \
      -k "forward_variants" 2>&1 | tee "$OUT/bdrest_tests.log" | tail -8 ;;
  deltafla)
    # issue 4: ours against fla, forward and forward+backward in one run (fla's ungated path with
    # g=None; its gated backward with the #640 guard off, timing only, and fla-vs-ours differences)
    # issue 4 names n_h 1-4; 1, 2, 4 took about 300 s on an H200 (2026-11-26, ninth session).
    # --fla-accuracy: ours and fla's bf16 errors against fp64 on the same inputs (is fla's storage
    # in 16 bits within our 5e-3 bound? 0.7-1.0e-2 from ours in the tenth session's run)
    timeout ${STAGE_TIMEOUT:-420} python3 benchmarks/delta_throughput.py --nh ${DELTA_NH:-1 2 3 4} --fla-unguarded --fla-accuracy \
      --out "$OUT" --results "$OUT/RESULTS_deltafla.md" 2>&1 | tee "$OUT/deltafla.log" | tail -30 ;;
  deltaprof)
    # issue 4: per-kernel CUDA times of one fwd+bwd at n_h 1 and 4 (the forward's gap to fla grew
    # from 1.04x to 1.22x with n_h on 2026-11-25: which kernel grows faster than fla's?)
    # fla's chunk_gated_delta_product is profiled on the same inputs after ours (--profile-fla)
    # (each table is also in $OUT/delta_profile.txt as soon as it is taken; a cold machine needed
    # more than 300 s for n_h 2 gated and ungated with fla on 2026-12-03)
    timeout ${STAGE_TIMEOUT:-420} python3 benchmarks/delta_throughput.py --profile --profile-fla \
      --fla-unguarded --nh ${DELTA_NH:-1 4} --gated ${DELTA_GATED:-0 1} --out "$OUT" \
      2>&1 | tee "$OUT/deltaprof.log" | tail -60 ;;
  deltafp32)
    # float32 inputs, TF32 off: the fp32 GPU checks under both TUNE["fp32_dot"] settings (exact
    # fp32 dots, or three tf32 products a dot), then both timed with their errors against fp64
    # (bound 1e-4). The fifty-sixth session's sm_90a compile: "ieee" 32 registers a thread with
    # 17-74 KB of spills in every delta kernel, "tf32x3" 255 with 0.1-2.7 KB
    timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -rfEs -p no:cacheprovider tests/gpu/test_gpu_delta.py \
      -k fp32 2>&1 | tee "$OUT/deltafp32_tests.log" | tail -8
    timeout ${STAGE_TIMEOUT:-400} python3 benchmarks/delta_throughput.py --dtype fp32 --nh ${DELTA_NH:-1 2} \
      --variants default fp32_ieee --out "$OUT" --results "$OUT/RESULTS_deltafp32.md" 2>&1 \
      | tee "$OUT/deltafp32.log" | tail -30 ;;
  delta)
    timeout ${STAGE_TIMEOUT:-560} python3 benchmarks/delta_throughput.py --modes fwd --out "$OUT" \
      --results "$OUT/RESULTS_delta.md" 2>&1 | tee "$OUT/delta.log" | tail -40 ;;
  deltavar)
    # DELTA_TESTS=0 skips the GPU tests; DELTA_VAR_FLA=1 times fla in the same run (a "vs fla" column)
    [ "${DELTA_TESTS:-1}" = 0 ] || timeout ${TEST_TIMEOUT:-320} python3 -m pytest -q -rfEs -p no:cacheprovider \
      tests/gpu/test_gpu_delta.py 2>&1 | tee "$OUT/deltavar_tests.log" | tail -8
    # DELTA_VARIANTS: which --variants (default: the sixth session's opt-ins against the default);
    # DELTA_KERNELS=1 adds each kernel's time under each variant (--kernels); DELTA_MODES the passes
    timeout ${STAGE_TIMEOUT:-320} python3 benchmarks/delta_throughput.py --nh ${DELTA_NH:-2 4} \
      ${DELTA_VAR_FLA:+--variants-fla --fla-unguarded} ${DELTA_KERNELS:+--kernels} --modes ${DELTA_MODES:-fwd fwd+bwd} \
      --variants ${DELTA_VARIANTS:-default s11_default dhs16 reload_k_always} --out "$OUT" \
      --results "$OUT/RESULTS_deltavar.md" 2>&1 | tee "$OUT/deltavar.log" | tail -40 ;;
  deltaab)
    d=${AB_DIR:-ab_prev}
    ls "$d"/*.py > /dev/null || { echo "deltaab: no kernel files in $d" >&2; exit 2; }
    mkdir -p /tmp/ab_cur
    for f in "$d"/*.py; do cp "kernels/delta_product/$(basename "$f")" /tmp/ab_cur/ || exit 2; done
    for side in new old new2; do
      if [ $side = old ]; then cp "$d"/*.py kernels/delta_product/; else cp /tmp/ab_cur/*.py kernels/delta_product/; fi
      echo "== deltaab: $side ($(ls "$d" | tr '\n' ' '))"
      timeout ${STAGE_TIMEOUT:-240} python3 benchmarks/delta_throughput.py --nh ${DELTA_NH:-2} --modes fwd+bwd \
        --variants default ${DELTA_KERNELS:+--kernels} --out "$OUT/ab_$side" --results "$OUT/RESULTS_ab_$side.md" 2>&1 \
        | tee "$OUT/ab_$side.log" | grep -v "^\[check\]" | tail -14
    done
    cp /tmp/ab_cur/*.py kernels/delta_product/ ;;
  sweep)
    # SWEEP_SET (chunk|bwd|summary|lb1|few), SWEEP_FWD=1 (forward alone), SWEEP_M, SWEEP_SHAPES,
    # SWEEP_CHOICES (a subset of the set), SWEEP_PROFILE=1 (each row's kernel times)
    timeout ${STAGE_TIMEOUT:-560} python3 tools/fwdbwd_chunk_sweep.py --out "$OUT" --set ${SWEEP_SET:-chunk} \
      ${SWEEP_FWD:+--fwd} ${SWEEP_GRAPH:+--graph} ${SWEEP_PROFILE:+--profile} ${SWEEP_CHOICES:+--choices $SWEEP_CHOICES} \
      --m ${SWEEP_M:-1 2 4 8 16} --shapes ${SWEEP_SHAPES:-8x2048x768 1x16384x768} \
      2>&1 | tee -a "$OUT/sweep.log" | tail -40 ;;
  ncu)
    # hardware counters of the block-diagonal kernels (tools/ncu_bd.py): NCU_M, NCU_SHAPE, NCU_GRAD=1, NCU_TUNE
    # (JSON), NCU_KERNELS (regex), NCU_SKIP/NCU_COUNT (launches), NCU_SECTIONS
    tune=${NCU_TUNE:-}; [ -n "$tune" ] || tune='{}'
    timeout ${STAGE_TIMEOUT:-300} ncu --clock-control none --kernel-name "regex:${NCU_KERNELS:-_bd_}" \
      --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-20} \
      $(for s in ${NCU_SECTIONS:-SpeedOfLight Occupancy LaunchStats WarpStateStats SchedulerStats MemoryWorkloadAnalysis}; do printf -- "--section %s " $s; done) \
      python3 tools/ncu_bd.py --m ${NCU_M:-8 16} --shape ${NCU_SHAPE:-1x16384x768} ${NCU_GRAD:+--grad} --tune "$tune" \
      > "$OUT/ncu_$(date +%H%M%S).log" 2>&1; tail -5 "$OUT"/ncu_*.log ;;
  sumthread)
    # issue 3: summary_thread.py (the default chunk summaries at m = 5..8 since the sixty-seventh session)
    timeout ${STAGE_TIMEOUT:-400} python3 -m pytest -v -p no:cacheprovider tests/gpu/test_gpu_block_diagonal.py \
      -k "summary_thread or long_chunked_varlen or inference_plans_batch1 or more_than_2_31_elements" 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -30
    timeout 150 python3 benchmarks/scan_throughput.py --shapes 1x16384x768 --skip-variants --no-peers \
      --out "$OUT/st" --results "$OUT/RESULTS_st.md" 2>&1 | grep -i "fwd\|copy" | head -20 ;;
  lbthread)
    # issue 3: lookback_thread.py (opt-in single pass with one block per thread): races, then the
    # B1 T16384 and B8 T2048 N768 forwards against the default (m = 4, 6, 8) in 8- to 64-step tiles
    timeout 200 python3 -m pytest -v -p no:cacheprovider tests/test_kernels_lookback_thread.py -k gpu_many \
      2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -8
    lbt='{"bd_lookback":"always","bdlb_kind":"thread","lbt_chunk":'  # always: B8 T2048 runs one ring pass
    for m in ${LBT_M:-8 6 4}; do  # cold compiles: m = 4 may not fit the call; LBT_M=4 in a second one
      timeout 190 python3 tools/tune_compare.py --m $m --shapes 1x16384x768 8x2048x768 --rounds 3 --out "$OUT/lbt$m" \
        --tune t8="${lbt}8}" t16="${lbt}16}" t32="${lbt}32}" t64="${lbt}64}" \
        f16="${lbt}16,\"lbt_walk\":\"forward\"}" f32="${lbt}32,\"lbt_walk\":\"forward\"}" 2>&1 | grep -E "^B|fails"
    done ;;
  rerun)
    # issue 3: summary.rerun_factor (TUNE['rerun_len']); the m = 6 backward's kernel at many programs
    timeout 200 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_gpu_block_diagonal.py -k rerun_over_summary \
      2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -5
    for m in 4 8; do
      timeout 60 python3 tools/tune_compare.py --m $m --shapes 1x16384x768 1x65536x768 --rounds 3 --out "$OUT/rr$m" \
        --tune r256='{"rerun_len":256}' r512='{"rerun_len":512}' 2>&1 | grep -E "^B|fails"
    done
    timeout 60 python3 tools/tune_compare.py --m 8 --bwd --shapes 1x16384x768 --rounds 3 --out "$OUT/rr8b" \
      --tune r256='{"rerun_len":256}' 2>&1 | grep -E "^B|fails"
    timeout 90 python3 tools/tune_compare.py --m 6 --bwd --shapes 1x16384x768 16x2048x768 --rounds 3 --out "$OUT/m6bwd" \
      --tune ring2='{"bwd_variant":"ring2"}' v1g='{"bwd_variant":"v1","bwd_gather":true}' 2>&1 | grep -E "^B|fails" ;;
  ncubytes)
    # issue 4: bytes actually moved by each delta kernel (the second fwd+bwd of tools/ncu_delta.py),
    # to set against the time: how far each kernel is from the HBM roofline
    for gt in ${NCU_GATED:-0 1}; do
      timeout ${STAGE_TIMEOUT:-150} ncu --clock-control none \
        --kernel-name "regex:tri_inv64|state_fwd_fused|output_|dv_local|state_bwd_fused|dqkwg_bwd|wy_bwd_vn" \
        --launch-skip 7 --launch-count 7 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
        python3 tools/ncu_delta.py --nh ${NCU_NH:-2} $([ "$gt" = 1 ] && echo --gated) \
        > "$OUT/ncu_bytes_g${gt}.log" 2>&1
      grep -E "^ +[a-z_0-9]+_kernel|gpu__time|dram__bytes|lts__t_bytes" "$OUT/ncu_bytes_g${gt}.log" | sed 's/  */ /g'
    done ;;
  ncudelta)
    # issue 4: hardware counters of the delta backward kernels (tools/ncu_delta.py), B8 T4096 H16
    # K=V=128 bf16: NCU_NH, NCU_GATED (0 1), NCU_TUNE (JSON), NCU_KERNELS (regex), NCU_SECTIONS
    tune=${NCU_TUNE:-}; [ -n "$tune" ] || tune='{}'
    for gt in ${NCU_GATED:-0 1}; do
      timeout ${STAGE_TIMEOUT:-300} ncu --clock-control none \
        --kernel-name "regex:${NCU_KERNELS:-state_bwd_fused|dqkwg_bwd|wy_bwd_vn}" --launch-skip 3 --launch-count 3 \
        $(for s in ${NCU_SECTIONS:-SpeedOfLight Occupancy LaunchStats WarpStateStats MemoryWorkloadAnalysis SchedulerStats}; do printf -- "--section %s " $s; done) \
        python3 tools/ncu_delta.py --nh ${NCU_NH:-2} $([ "$gt" = 1 ] && echo --gated) --tune "$tune" \
        > "$OUT/ncu_delta_g${gt}_$(date +%H%M%S).log" 2>&1; tail -3 "$OUT"/ncu_delta_g${gt}_*.log
    done ;;
  layers)
    timeout ${STAGE_TIMEOUT:-560} python3 benchmarks/layer_targets.py --precisions bf16-autocast --out "$OUT" \
      --fla-unguarded --results "$OUT/RESULTS_layers.md" 2>&1 | tee "$OUT/layers.log" | tail -40 ;;
  diagtile)
    timeout ${STAGE_TIMEOUT:-560} python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_gpu_block_diagonal.py \
      -k "diag_tiles or diagonal_api" 2>&1 | tee "$OUT/diagtile_tests.log" | tail -5
    timeout ${STAGE_TIMEOUT:-560} python3 tools/diag_tile_vs_accel.py --out "$OUT" 2>&1 | tee "$OUT/diagtile.log" | tail -40 ;;
  tmaccel)
    # issue 3: the time-contiguous m = 1 scan (time_major.py) against accelerated-scan on its own
    # (B, N, T) layout, tools/tm_vs_accel.py; TM_ARGS e.g. "--shapes 8x2048x4096 --configs a=tm_bt:1024"
    timeout ${STAGE_TIMEOUT:-560} python3 tools/tm_vs_accel.py --out "$OUT" --rounds ${TM_ROUNDS:-3} ${TM_ARGS:-} \
      2>&1 | tee -a "$OUT/tmaccel.log" | tail -60 ;;
  bhsweep)
    timeout ${STAGE_TIMEOUT:-560} python3 tools/fwd_bh_sweep.py --m 4 2 --out "$OUT" 2>&1 | tee "$OUT/bhsweep.log" | tail -40 ;;
  fusedcomp)
    # first the GPU tests of the fused and companion kernels, poisoned (companion m = 32 / 64 have
    # not run on a GPU yet, forty-third session), then the benchmark: its rows go to
    # benchmarks/RESULTS.md on the device and a copy to $OUT
    LRNN_SCAN_POISON=1 timeout 240 python3 -m pytest -q -rfEs -p no:cacheprovider \
      tests/gpu/test_gpu_fused_companion.py 2>&1 | tee "$OUT/fusedcomp.log" | tail -3
    timeout ${STAGE_TIMEOUT:-450} python3 benchmarks/fused_companion_throughput.py --copy-to "$OUT" 2>&1 \
      | tee -a "$OUT/fusedcomp.log" | tail -30 ;;
  unfused)
    # the routing's GPU test, then bdlru_scan's methods (--route: kernel / auto / unfused), eager
    # (the unfused path's host work sets the step lines), on both sides of each block size's lines
    # (fused_gates.UNFUSED_LINES: steps, and programs an SM; N768). Printed lines go to the log;
    # the JSONs are dropped (the device returns at most 8 files)
    LRNN_SCAN_POISON=1 timeout 200 python3 -m pytest -q -rfEs -p no:cacheprovider \
      tests/gpu/test_gpu_fused_companion.py -k unfused 2>&1 | tee "$OUT/unfused.log" | tail -3
    # "bwd m shapes" (fwd+bwd) and "fwd m shapes" (a forward alone: its own, shorter step lines)
    for ms in "bwd 2 1x4096x768 1x8192x768 4x8192x768 6x8192x768" "bwd 4 1x6144x768 1x8192x768 2x8192x768 3x8192x768" \
              "bwd 8 1x2048x768 1x4096x768 2x4096x768 3x4096x768" "bwd 16 1x1024x768 1x2048x768 3x2048x768 4x2048x768" \
              "bwd 32 1x256x768 1x512x768 8x2048x768 11x2048x768" "fwd 4 1x2048x768 1x4096x768" \
              "fwd 16 1x256x768 1x512x768" "fwd 32 1x128x768 1x256x768"; do
      set -- $ms
      pass=$1; m=$2; shift 2
      timeout 100 python3 tools/gate_tune_compare.py --kind fused --m $m $([ $pass = bwd ] && echo --bwd) \
        --route --eager --baseline --rounds 2 --out "$OUT/unfused_json" --shapes "$@" 2>&1 \
        | tee -a "$OUT/unfused.log" | grep "fp32,"
    done
    rm -rf "$OUT/unfused_json" ;;
  chunked)
    # the fused / companion GPU tests (the companion kernels' one-pass code changed with the
    # chunked passes: every test, not only -k chunked) and the compiled fused op's chunks, then
    # the companion's forced chunks against one pass and the same recurrence as dense blocks
    # (--baseline), CUDA graphs; logits fwd+bwd then coefficients fwd+bwd
    LRNN_SCAN_POISON=1 timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider \
      tests/gpu/test_gpu_fused_companion.py tests/gpu/test_gpu_compile.py \
      -k "fused or companion or chunked or hlru" 2>&1 | tee "$OUT/chunked.log" | tail -3
    for kind in logits coeffs; do for m in 2 4 8; do
      timeout 60 python3 tools/gate_tune_compare.py --kind $kind --m $m --bwd --baseline --rounds 2 \
        --tune c128=chunk:128 c256=chunk:256 --out "$OUT/chunked_json" \
        --shapes 1x4096x768 1x16384x768 4x8192x768 2>&1 | tee -a "$OUT/chunked.log" | grep "fp32,"
    done; done
    rm -rf "$OUT/chunked_json" ;;
  scan)
    # --skip-variants: the forward-variant and m = 1 tile rows (36 extra compilations; with them the
    # 2026-11-25 run did not finish in 390 s) are in RESULTS.md (2026-11-24, 2026-11-25)
    # SCAN_ARGS: more options, e.g. SCAN_ARGS="--no-peers --shapes 1x16384x768". Carry ".whl":
    # without it accelerated-scan's rows are missing (fifteenth session, call 5)
    timeout ${STAGE_TIMEOUT:-560} python3 benchmarks/scan_throughput.py --skip-variants ${SCAN_ARGS:-} --out "$OUT" \
      --results "$OUT/RESULTS_scan.md" 2>&1 | tee "$OUT/scan.log" | tail -40 ;;
  train)
    cfg=${TRAIN_CONFIG:-mad_tasks/configs/gpu_tables_next6.json}
    python3 -m lrnn_scan.mad_tasks launch --config "$cfg" \
      --out "$OUT/$(basename "$cfg" .json)" --deadline-s ${STAGE_TIMEOUT:-560} 2>&1 | tee "$OUT/train.log" | tail -40
    # "pause": true configs: every run directory with a checkpoint goes back as one tar (about 12 MB
    # a run at d_model 128; the device returns 8 files of at most 16 MiB). Here:
    #   for f in FILES_AT/ckpt_*.tar; do tar xf $f; done    (from the repo root)
    # and carry the config's out_dir (e.g. runs/gpu_tables_next7) in the next call, which resumes.
    runs=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c['out_dir'] if c.get('pause') else '')" "$cfg")
    if [ -n "$runs" ]; then
      i=0
      for ck in $(find "$runs" -name checkpoint.pt | sort); do
        tar cf "$OUT/ckpt_$i.tar" "$(dirname "$ck")"; i=$((i + 1))
      done
      echo "saved $i run directories of $runs as ckpt_*.tar"
      exit 0     # no Triton cache file: the 8 returned files are the records and the checkpoints
    fi ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
# the compiled kernels go back with the results (one file), for the next call to carry
# (tools/gpu_pair.sh sets TRITON_CACHE_SAVE=0 and saves the cards' shared cache once at the end)
[ "${TRITON_CACHE_SAVE:-1}" = 0 ] || OUT="$OUT" bash tools/triton_cache.sh save
