#!/usr/bin/env bash
# The GPU check, for a fresh machine with an NVIDIA GPU: installs the CUDA flavour
# (vllm==0.32.0, via setup.sh) and runs the tests marked `gpu` (tests/engine/test_sinks_gpu.py):
# logprobs of sinks + window on FlashAttention against the masked reference, the cliff/slope
# pair through the CLI, and decode step time with sinks vs vLLM's native sliding window.
# Prints each figure on a `gpu_check:` line and the time taken. Aimed at under ten minutes,
# install included; written without a GPU, so not yet timed on one.
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0

if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L; }; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L failed); nothing to check" >&2
  exit 1
fi

bash scripts/setup.sh test  # picks the CUDA extra because nvidia-smi works
echo "gpu_check: set-up took ${SECONDS}s"
.venv/bin/python - <<'PY'
import torch
import vllm

assert torch.cuda.is_available(), "torch in .venv sees no CUDA device"
print(f"gpu_check: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"{torch.cuda.get_device_name(0)}")
PY

log="$(mktemp -t metronome-gpu-check.XXXXXX.log)"
started=$SECONDS
set +e
# -s: the tests print their figures; -rs: a skip here would mean CUDA was not seen.
timeout 900 .venv/bin/python -m pytest -q -s -rs -m gpu -p no:cacheprovider \
  tests/engine/test_sinks_gpu.py >"$log" 2>&1
rc=$?
set -e
tail -n 30 "$log"
echo "----- figures (full log: $log)"
grep -o 'gpu_check: .*' "$log" || echo "gpu_check: no figures printed"
echo "gpu_check: tests took $((SECONDS - started))s, ${SECONDS}s in all; pytest exit status $rc"
exit $rc
