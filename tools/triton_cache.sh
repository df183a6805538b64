#!/usr/bin/env bash
# Carry Triton's kernel cache from one device call to the next, so a later call does not spend its
# minutes recompiling kernels whose source did not change (2026-11-25: most of a 390 s
# scan_throughput.py run was compilation). Each call starts a fresh machine with an empty cache.
#
#   bash tools/triton_cache.sh save      # on the device, at the end of a command: $OUT/triton_cache.tar.gz
#                                        # (or triton_cache.tar.gz.part-00, -01, ... when over 15 MiB)
#   rm -rf .triton_cache && mkdir .triton_cache && cp <files_at>/triton_cache.tar.gz* .triton_cache/
#   run(..., carry=[".whl", ".triton_cache"])   # next call: tools/device_setup.sh restores it
#
# tools/jit_cache.py builds such a cache on the CPU machine before any device call (pack writes
# .triton_cache/triton_cache.tar.gz, which restore unpacks the same way).
# Triton keys each entry by its source, options, Triton version and GPU arch (sm_90 on both the
# H100 and the H200), so a stale entry is a miss, never a wrong kernel. Files back from $OUT are
# capped at 16 MiB each and 8 in all: a larger archive goes back in parts of 15 MiB, at most
# TRITON_CACHE_PARTS (default 3) of them, else it is not written (the message says so).
# device_setup.sh sets TRITON_STORE_BINARY_ONLY=1 so the cache holds cubins and metadata only
# (with the IR text the tests2 + train call of 2026-11-25 left 21 MiB compressed). A cold call of
# 2026-11-26 (tenth session) spent 246 s compiling tests/gpu/test_gpu_delta.py, which the warm
# machine then ran in 3 s: the cache is most of a call's time where kernels did not change.
# TRITON_CACHE_ONLY (an extended regex over the file names of each cache entry, e.g.
# "dqkwg|wy_bwd|state_|output_|tri_inv|dv_local|chunk_") saves only the entries it matches: the
# twelfth session's full cache was 66 MiB compressed, over the 45 MiB that come back.
set -uo pipefail
dir=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
archive=.triton_cache/triton_cache.tar.gz
case "${1:-}" in
  restore)
    parts=$(ls .triton_cache/triton_cache.tar.gz.part-* 2>/dev/null | sort)
    if [ -f "$archive" ] || [ -n "$parts" ]; then
      mkdir -p "$dir"
      { if [ -n "$parts" ]; then cat $parts; else cat "$archive"; fi; } | tar xz -C "$dir" \
        && echo "triton cache: restored $(find "$dir" -name '__grp__*' | wc -l) kernels into $dir"
    else
      echo "triton cache: no $archive (cold compile)"
    fi ;;
  save)
    out=${OUT:?OUT is not set}
    [ -d "$dir" ] || { echo "triton cache: $dir does not exist"; exit 0; }
    rm -f "$out"/triton_cache.tar.gz "$out"/triton_cache.tar.gz.part-*
    if [ -n "${TRITON_CACHE_ONLY:-}" ]; then
      entries=$(cd "$dir" && for e in */; do
        ls "$e" | grep -Eq -- "$TRITON_CACHE_ONLY" && echo "${e%/}"; done)
      [ -n "$entries" ] || { echo "triton cache: no entry matches TRITON_CACHE_ONLY=$TRITON_CACHE_ONLY; not saved"; exit 0; }
      echo "triton cache: $(echo "$entries" | wc -l) entries match TRITON_CACHE_ONLY"
      # shellcheck disable=SC2086
      tar czf "$out/triton_cache.tar.gz" -C "$dir" $entries || exit 0
    else
      tar czf "$out/triton_cache.tar.gz" -C "$dir" . || exit 0
    fi
    size=$(stat -c %s "$out/triton_cache.tar.gz")
    limit=$((15 * 1024 * 1024))
    n=$(( (size + limit - 1) / limit ))
    if [ "$n" -gt "${TRITON_CACHE_PARTS:-3}" ]; then
      rm -f "$out/triton_cache.tar.gz"
      echo "triton cache: $((size / 1048576)) MiB compressed, more than ${TRITON_CACHE_PARTS:-3} files of 15 MiB; not saved (TRITON_CACHE_ONLY narrows it)"
    elif [ "$n" -gt 1 ]; then
      split -b "$limit" -d -a 2 "$out/triton_cache.tar.gz" "$out/triton_cache.tar.gz.part-" \
        && rm -f "$out/triton_cache.tar.gz"
      echo "triton cache: saved $(find "$dir" -name '__grp__*' | wc -l) kernels, $((size / 1024)) KiB in $n parts"
    else
      echo "triton cache: saved $(find "$dir" -name '__grp__*' | wc -l) kernels, $((size / 1024)) KiB"
    fi ;;
  *) echo "usage: triton_cache.sh restore|save" >&2; exit 2 ;;
esac
