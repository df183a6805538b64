#!/usr/bin/env bash
# Run the GPU checks over several device calls: each call skips the tests an earlier call passed
# and carries Triton's kernel cache forward. Why: a fresh machine compiles every kernel, so
# `pytest tests/gpu` does not fit one 10-minute call (2026-11-29: 55 tests in 540 s, cold); the
# thirty-third and thirty-fourth sessions could not finish the suite.
#
# On the device, from the repo root, after `source tools/device_setup.sh`:
#   bash tools/gpu_suite_resume.sh
# with carry [".whl", "gpu_runs", ".triton_cache"]. Reads gpu_runs/suite_passed.txt (node ids, one
# a line; absent = none), writes $OUT/suite_passed.txt (those plus this call's passes, which
# tools/pytest_resume.py records as they pass), $OUT/suite.log and $OUT/triton_cache.tar.gz*
# (tools/triton_cache.sh save). Before the next call:
#   cp <files_at>/suite_passed.txt gpu_runs/ && rm -rf .triton_cache && mkdir .triton_cache \
#     && cp <files_at>/triton_cache.tar.gz* .triton_cache/
# Settings: SUITE_FILES (pytest arguments, default tests/gpu), SUITE_TIMEOUT (seconds, 480),
# SUITE_PASSED (the list read, default gpu_runs/suite_passed.txt). One process: the full-size
# checks take up to 60 GB each (docs/status.md, "Correctness").
set -uo pipefail
out=${OUT:?OUT: the folder whose files come back}
passed_in=${SUITE_PASSED:-gpu_runs/suite_passed.txt}
n_before=0
[ -f "$passed_in" ] && n_before=$(grep -c . "$passed_in")
echo "suite: $n_before tests passed in earlier calls, deselected"
cp "$passed_in" "$out/suite_passed.txt" 2>/dev/null || : > "$out/suite_passed.txt"
: > "$out/suite_new.txt"
# tools/pytest_resume.py deselects the ids of earlier passes and appends each pass as it happens
# shellcheck disable=SC2086  # SUITE_FILES is a list of pytest arguments
PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 timeout "${SUITE_TIMEOUT:-480}" \
  python3 -m pytest -q -rfE -p no:cacheprovider -p pytest_resume --resume-skip "$passed_in" \
  --resume-log "$out/suite_new.txt" ${SUITE_FILES:-tests/gpu} > "$out/suite.log" 2>&1
rc=$?
cat "$out/suite_new.txt" >> "$out/suite_passed.txt"
n_now=$(grep -c . "$out/suite_new.txt")
n_failed=$(grep -cE '^(FAILED|ERROR) ' "$out/suite.log")
case $rc in
  124|137) state="stopped at SUITE_TIMEOUT (run again to go on)" ;;
  0) state="finished, all selected tests passed" ;;
  5) state="finished, nothing left to run" ;;
  *) state="finished with failures (pytest exit $rc)" ;;
esac
echo "suite: this call $n_now passed, $n_failed failed or errored; $(grep -c . "$out/suite_passed.txt") passed in all; $state"
grep -E '^(FAILED|ERROR) ' "$out/suite.log" | head -20
tail -3 "$out/suite.log"
# at most 3 parts of 15 MiB (its default): a carry holds 64 MiB with .whl in it
bash tools/triton_cache.sh save
