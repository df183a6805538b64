#!/usr/bin/env bash
# Two lists of tools/gpu_owed.sh stages, one per GPU of a two-GPU machine (device kind
# nvidia-h100-x2 / nvidia-h200-x2), run at the same time: timings on one card, tests or training on
# the other, so one device call does the work of two. From the repo root on the device:
#   bash tools/gpu_pair.sh "STAGE0 [VAR=value ...]" "STAGE1 [VAR=value ...]"
# e.g.  bash tools/gpu_pair.sh "STAGE_TIMEOUT=500 TRAIN_CONFIG=mad_tasks/configs/gpu_tables_next11.json train" \
#                              "DELTA_NH=1,2,4 STAGE_TIMEOUT=300 deltavar STAGE_TIMEOUT=200 deltafla"
# VAR=value words set a variable for the stages after them (on that card only; commas in a value
# become spaces). GPU_PAIR_DRY=1 prints what each card would run instead. Each card's stages
# write to $OUT/t0 or $OUT/t1 and their logs to $OUT/t<card>_<stage>.out; checkpoints of a
# "pause" training config end up in $OUT (ckpt_*.tar), the shared Triton cache in
# $OUT/triton_cache.tar.gz[.part-NN] (tools/triton_cache.sh; not when checkpoints take the files).
# Everything else goes back as one $OUT/logs.tar.gz (the device returns at most 8 files of 16 MiB).
# Here afterwards: rm -rf .triton_cache && mkdir .triton_cache && cp FILES_AT/triton_cache.tar.gz* .triton_cache/ and
# carry [".whl", ".triton_cache"] in the next call.
set -uo pipefail
OUT=${OUT:?OUT is not set}
DRY=${GPU_PAIR_DRY:-0}
if [ "$DRY" = 0 ]; then
  source tools/device_setup.sh > "$OUT/setup.log" 2>&1
  tail -4 "$OUT/setup.log"
fi
run_card() {   # card, stage list
  local card=$1 word val
  mkdir -p "$OUT/t$card"
  export CUDA_VISIBLE_DEVICES=$card TRITON_CACHE_SAVE=0   # one save of the shared cache, below
  for word in $2; do
    case $word in
      *=*) val=${word#*=}; export "${word%%=*}=${val//,/ }" ;;
      *) if [ "$DRY" = 0 ]; then
           OUT="$OUT/t$card" bash tools/gpu_owed.sh "$word" > "$OUT/t${card}_$word.out" 2>&1
         else
           echo "card $card: $word (STAGE_TIMEOUT=${STAGE_TIMEOUT:-} DELTA_NH=${DELTA_NH:-} TRAIN_CONFIG=${TRAIN_CONFIG:-})"
         fi ;;
    esac
  done
}
( run_card 0 "${1:-}" ) &
( run_card 1 "${2:-}" ) &
wait
[ "$DRY" = 0 ] || exit 0
for f in "$OUT"/t0_*.out "$OUT"/t1_*.out; do [ -f "$f" ] && { echo "##### $f"; tail -25 "$f"; }; done
mv "$OUT"/t0/ckpt_*.tar "$OUT"/t1/ckpt_*.tar "$OUT"/ 2>/dev/null
# the two cards share one Triton cache directory: one archive of it (in parts if over 15 MiB)
# instead of each stage's own, and everything else in logs.tar.gz, so that the device's 8 returned
# files are the logs, the cache parts and any checkpoints (loose files past 8 do not come back)
ls "$OUT"/ckpt_*.tar > /dev/null 2>&1 || OUT="$OUT" bash tools/triton_cache.sh save
tar czf "$OUT/logs.tar.gz" -C "$OUT" --exclude='*.tar' t0 t1 $(cd "$OUT" && ls ./*.out setup.log 2>/dev/null) \
  && rm -rf "$OUT"/t0 "$OUT"/t1 "$OUT"/*.out "$OUT"/setup.log
ls -la "$OUT"
