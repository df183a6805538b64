#!/usr/bin/env bash
# The GPU checks and timings still owed to the open issues, in priority order, one stage per
# device call (each fits the 10-minute limit). On the lent GPU machine, from the repo root:
#   source tools/device_setup.sh && bash tools/gpu_owed.sh STAGE
# STAGE: tests    — GPU correctness not yet run on the current defaults/variants (~4 min)
#        lookback — issue 3: single-pass look-back forward vs the default (m = 1)
#        delta    — issue 4: the fused W/U and batched-inverse variants vs the defaults
#        layers   — issue 7: layer targets in bf16 after the ShortConv / L2-norm changes
#        scan     — issue 3: the full scan_throughput.py run with the final defaults
#        train    — issue 6: longer S5 / S4 / Chomsky runs (mad_tasks/configs/gpu_tables_next.json,
#                   11 processes sharing the GPU, 480 s each; the previous run's budgets were
#                   too short for these columns, mad_tasks/RESULTS.md §4)
# Logs and result files go to $OUT (or ./gpu_out); rows are appended to $OUT/RESULTS_<stage>.md
# so they can be reviewed before they are merged into benchmarks/RESULTS.md.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
stage=${1:?usage: gpu_owed.sh tests|lookback|delta|layers|scan|train}
case "$stage" in
  tests)
    timeout 560 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_gpu_l2norm.py \
      tests/test_kernels_lookback.py tests/gpu/test_gpu_delta.py \
      tests/gpu/test_gpu_models.py -k "not (bdlru or hlru or diag or lstm or mamba)" \
      "tests/gpu/test_gpu_block_diagonal.py::test_more_than_2_31_elements" \
      "tests/gpu/test_gpu_block_diagonal.py::test_backward_ring" 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
  lookback)
    timeout 560 python3 benchmarks/scan_throughput.py --lookback-compare --out "$OUT" \
      --results "$OUT/RESULTS_lookback.md" 2>&1 | tee "$OUT/lookback.log" | tail -40 ;;
  delta)
    timeout 560 python3 benchmarks/delta_throughput.py --variants --out "$OUT" \
      --results "$OUT/RESULTS_delta.md" 2>&1 | tee "$OUT/delta.log" | tail -40 ;;
  layers)
    timeout 560 python3 benchmarks/layer_targets.py --precisions bf16-autocast --out "$OUT" \
      --results "$OUT/RESULTS_layers.md" 2>&1 | tee "$OUT/layers.log" | tail -40 ;;
  scan)
    timeout 560 python3 benchmarks/scan_throughput.py --out "$OUT" \
      --results "$OUT/RESULTS_scan.md" 2>&1 | tee "$OUT/scan.log" | tail -40 ;;
  train)
    python3 -m lrnn_scan.mad_tasks launch --config mad_tasks/configs/gpu_tables_next.json \
      --out "$OUT/gpu_tables_next" --deadline-s 560 2>&1 | tee "$OUT/train.log" | tail -40 ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
