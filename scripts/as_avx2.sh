#!/usr/bin/env bash
# Run a command as on an AVX2-only CPU without bf16 hardware (AMD Zen 3, most laptops and CI
# runners), on a CPU that has AVX-512 or AMX. An emulation, not that machine: the model is
# chosen fp32 (engine/dtype.py reads METRONOME_CPU_FLAGS), PyTorch, oneDNN and MKL are capped at
# AVX2 kernels, and vLLM loads its AVX2 build of its own kernels (scripts/as_avx2/sitecustomize.py
# makes torch report no AVX-512/AMX). The clock, caches and memory stay this machine's: compare
# the fitted step cost with the real one's (docs/benchmarks/log.md, issue 25).
#   bash scripts/as_avx2.sh .venv/bin/metronome calibrate --engine vllm --json
#   bash scripts/as_avx2.sh bash scripts/test.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
flags="$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | tr ' ' '\n' \
         | grep -v -E '^(avx512|amx|avx_vnni)' | tr '\n' ' ')"
export METRONOME_CPU_FLAGS="$flags"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
export METRONOME_AS_AVX2=1
export PYTHONPATH="$here/as_avx2${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
