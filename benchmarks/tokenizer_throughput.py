"""Throughput of the audio frame tokenizer on one core; writes its section of docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/tokenizer_throughput.py [--runs 7] [--frames 2000] [--no-write]

Frames/s is per call, as the runtime calls it (one frame of one session at a time), pinned to
one core with every numeric library on one thread, and counted in CPU time of this process so
that other work on a shared machine does not count against it (the load average is recorded).
"× real time" is frames/s times the frame period: how many sessions one core could tokenize as
fast as they speak. The tokenizer's cost
does not depend on what the audio says, so the input is seeded noise under a syllable-rate
envelope (no espeak-ng needed).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy loads its BLAS

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from load_gen.tokenizer import FrameTokenizer  # noqa: E402
from load_gen.wav import Clip, WavFrames  # noqa: E402

SECTION = "## Audio frame tokenizer"
RATE_HZ = 16000
VOCAB = 2048
# (label, frame_ms, tokens_in, what is timed)
CASES = [
    ("tokenize, 80 ms, 16 tokens (default)", 80.0, 16, "tokenize"),
    ("tokenize, 80 ms, 8 tokens (Moshi-like)", 80.0, 8, "tokenize"),
    ("tokenize, 1 s, 25 tokens (omni-like)", 1000.0, 25, "tokenize"),
    ("WAV source next_frame, 80 ms, 16 tokens", 80.0, 16, "source"),
]


def speech_like(seconds: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * RATE_HZ)) / RATE_HZ
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 4 * t)) ** 2  # ~4 syllables per second
    return (0.1 * envelope * rng.standard_normal(len(t))).astype(np.float32)


def frames_per_s(frame_ms: float, tokens_in: int, what: str, n_frames: int) -> float:
    tok = FrameTokenizer(RATE_HZ, frame_ms, tokens_in, VOCAB)
    n = tok.frame_samples
    audio = speech_like(max(10.0, n_frames * n / RATE_HZ / 4))
    if what == "source":
        audio.flags.writeable = False
        source = WavFrames(Clip("bench", audio, RATE_HZ, RATE_HZ), tok, loop=True)
        t0 = time.process_time()
        for _ in range(n_frames):
            source.next_frame(tok.frame_s)
        return n_frames / (time.process_time() - t0)
    frames = [audio[i:i + n] for i in range(0, len(audio) - n + 1, n)]
    t0 = time.process_time()
    for i in range(n_frames):
        tok.tokenize(frames[i % len(frames)])
    return n_frames / (time.process_time() - t0)


def machine() -> str:
    model = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{model}, nproc {os.cpu_count()} (load average {load} at the start); "
            f"Python {platform.python_version()}, numpy {np.__version__}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--frames", type=int, default=5000, help="frames per run")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    host = machine()
    rows = []
    for label, frame_ms, tokens_in, what in CASES:
        frames_per_s(frame_ms, tokens_in, what, 50)  # warm caches and the FFT plan
        runs = [frames_per_s(frame_ms, tokens_in, what, args.frames) for _ in range(args.runs)]
        median = statistics.median(runs)
        rows.append((label, median, median * frame_ms / 1e3))
        print(f"{label:42s} {median:10.0f} frames/s {median * frame_ms / 1e3:8.0f}× real time "
              f"(runs: {', '.join(f'{r:.0f}' for r in runs)})", file=sys.stderr)
    text = section(rows, host, args.runs, args.frames)
    print(text)
    if not args.no_write:
        write_section(ROOT / "docs" / "BENCHMARKS.md", text)
    return 0


def section(rows, host: str, runs: int, n_frames: int) -> str:
    def para(text: str, indent: str = "") -> str:
        return textwrap.fill(text, 100, subsequent_indent=indent)

    lines = [
        SECTION, "",
        para("`load_gen/tokenizer.py`: one frame of 16 kHz audio → `tokens_in` ids (log-mel + "
             "random-hyperplane codebook), called as the runtime calls it: one frame of one "
             "session at a time."), "",
        "- Command: `.venv/bin/python benchmarks/tokenizer_throughput.py`",
        para(f"- Machine: {host}", "  "),
        para("- One core (pinned with sched_setaffinity), OMP/MKL/OpenBLAS threads = 1; "
             "frames/s in CPU time of the process", "  "),
        f"- {runs} runs of {n_frames} frames each; medians. Measured {dt.date.today()}.", "",
        "| case | frames/s | × real time (one session) |", "|---|---:|---:|",
    ]
    lines += [f"| {label} | {fps:,.0f} | {rt:,.0f}× |" for label, fps, rt in rows]
    lines += ["", para("Target: ≥ 100× real time for one session at 80 ms frames. × real time "
                       "is also how many sessions one core tokenizes as fast as they speak."), ""]
    return "\n".join(lines)


def write_section(path: Path, text: str) -> None:
    """Replace this benchmark's section, or append it; other sections stay as they are."""
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(current):
        updated = pattern.sub(lambda _: text + "\n", current, count=1)
    else:
        updated = current.rstrip("\n") + "\n\n" + text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(updated.rstrip("\n") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
