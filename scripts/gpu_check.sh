#!/usr/bin/env bash
# The GPU check, for a fresh machine with an NVIDIA GPU: installs the CUDA flavour
# (vllm==0.32.0, via setup.sh) and runs the tests marked `gpu` (tests/engine/test_sinks_gpu.py):
# logprobs of sinks + window on FlashAttention against the masked reference, the cliff/slope
# pair through the CLI, and decode step time with sinks vs vLLM's native sliding window; then
# the audio-in model's engine tests and, with METRONOME_AUDIO_CHECKPOINT set to a local
# Qwen2-Audio folder, a windowed and an unbounded WAV run of that checkpoint.
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

# The audio-in path on CUDA: audio-tiny's engine tests (a frame's audio reaches the encoder,
# the block bound, rollover, the cliff), then a real checkpoint by path when one is given:
#   METRONOME_AUDIO_CHECKPOINT=/models/Qwen2-Audio-7B-Instruct bash scripts/gpu_check.sh
set +e
timeout 600 .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/engine/test_vllm_audio.py \
  >"$log.audio" 2>&1
audio_rc=$?
tail -n 5 "$log.audio"
echo "gpu_check: audio-tiny engine tests exit status $audio_rc"
if [ -n "${METRONOME_AUDIO_CHECKPOINT:-}" ] && command -v espeak-ng >/dev/null; then
  speech="$(mktemp -d)"
  espeak-ng -w "$speech/a.wav" "The quick brown fox jumps over the lazy dog."
  espeak-ng -w "$speech/b.wav" "Metronome keeps the beat while the model listens and answers."
  for policy in "--policy window --window 1024 --sinks 64 --pool-blocks 512" \
                "--policy unbounded --pool-blocks 64"; do
    # shellcheck disable=SC2086 # the policy words are separate arguments
    timeout 600 .venv/bin/metronome run --json --engine vllm --model "$METRONOME_AUDIO_CHECKPOINT" \
      --load wav --wav-dir "$speech" --sessions 8 --duration 20 $policy 2>>"$log.audio" \
      | .venv/bin/python -c 'import json,sys; s=json.loads(sys.stdin.read().splitlines()[-1]); print("gpu_check: checkpoint", {k: s.get(k) for k in ("status","policy","input_path","encoder_frames_per_frame","audio_tokens_per_frame","encoder_ms_per_frame","p50_ms","p95_ms","max_resident_blocks","stalled")})'
  done
fi
set -e
exit $(( rc || audio_rc ))
