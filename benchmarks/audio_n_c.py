"""N_c of the audio-in model and of the text stand-in at 80 and 160 ms frames (issue 36): the
calibration's own search (services/calibration.py: the sessions at which frame p95 reaches
0.8 × the budget with a bounded window), once per model and period, each on its own engine.

Models (both from seed 0): `audio-tiny` (its frames through its processor and encoder, the
encoder window one frame: tokens in per frame are what its processor makes of a frame, 4 at
80 ms and 6 at 160 ms) and the same Qwen2 LM alone as a text model (benchmarks/audio_model.py,
`lm_only`), fed the calibration's synthetic ids at the audio model's tokens per frame, so the
two differ only by the audio path. The audio model's synthetic load is seeded white noise.

    PYTHONPATH=. .venv/bin/python benchmarks/audio_n_c.py [--periods 80 160] [--models text audio]
        [--probe-s 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--periods", type=float, nargs="+", default=[80.0, 160.0])
    parser.add_argument("--probe-s", type=float, default=None)
    parser.add_argument("--models", nargs="+", choices=("text", "audio"),
                        default=["text", "audio"])
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the figures
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from benchmarks.audio_model import lm_only, machine
    from engine.audio_input import audio_input
    from engine.audio_model import build_audio_tiny
    from services import calibration

    audio_path = build_audio_tiny(0)
    text_path = lm_only(audio_path)
    print(f"machine: {machine()}")
    rows = []
    for frame_ms in args.periods:
        tokens = len(audio_input(audio_path, frame_ms).frame_ids)
        # Text first, then audio, per period: a neighbour's load drifts over minutes.
        for label, path, tokens_in in (("text", text_path, tokens), ("audio", audio_path, None)):
            if label not in args.models:
                continue
            print(f"\n{label} at {frame_ms:g} ms: load average {load_average()}", flush=True)
            t0 = time.monotonic()
            cal = calibration.calibrate("vllm", str(path), periods_ms=(frame_ms,),
                                        tokens_in=tokens_in, probe_s=args.probe_s)
            probes = ", ".join(f"{n}: {'> budget' if p is None else f'{p:.0f}'}"
                               f"{'' if ok else ' over'}" for n, p, _, ok, _ in cal.probes)
            print(f"  N_c {cal.n_c} (estimate {cal.n_c_estimate}), tokens in {cal.tokens_in}, "
                  f"target {cal.target_ms:g} ms; probes (sessions: p95 ms) {probes}; "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
            rows.append((label, frame_ms, cal.tokens_in, cal.n_c, cal.n_c_estimate))
    print(f"\nload average at the end: {load_average()}")
    print("\n| model | frame | tokens in per frame | N_c | the cost fit's estimate |")
    print("|---|---|---|---|---|")
    for label, frame_ms, tokens_in, n_c, estimate in rows:
        print(f"| {label} | {frame_ms:g} ms | {tokens_in} | {n_c} | {estimate} |")


if __name__ == "__main__":
    main()
