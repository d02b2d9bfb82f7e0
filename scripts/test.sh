#!/usr/bin/env bash
# The whole test suite, as CI runs it (the README's test command), in two phases:
#   1. every test that starts no vLLM engine, on several pytest-xdist workers (one per core,
#      at most 4): twin runs, the store, AppTest, the browser and gateway tests;
#   2. the vLLM tests (marked `vllm`) in one process, on an otherwise idle machine: they share
#      engines and one calibration of this machine (tests/vllm_machine.py), and measure
#      latency against it, which a second worker's load would skew.
# Extra arguments go to both phases (e.g. -x, -k NAME, tests/engine). Exit status: the first
# phase that failed (a phase that selects no test counts as passed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CORES="$(nproc 2>/dev/null || echo 2)"
WORKERS="${METRONOME_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
started=$SECONDS

"$PY" -m pytest -q -n "$WORKERS" -m "not vllm" "$@"
first=$?
# --durations: the slowest vLLM tests in the log, so a slow CI machine says where its time went
"$PY" -m pytest -q -m vllm -p no:xdist --durations=10 "$@"
second=$?
echo "test.sh: phase 1 (not vllm, $WORKERS workers) exit $first; phase 2 (vllm) exit $second;" \
     "$(( SECONDS - started )) s in all" >&2
for rc in $first $second; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi  # 5: no test selected
done
if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then exit 5; fi
exit 0
