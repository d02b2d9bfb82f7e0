"""Generated loads from their settings alone: planned arrivals and seeded synthetic token
frames. Shared by the live loads (load_gen.synthetic) and replay (load_gen.trace_load), which
recomputes a recorded run's arrivals and tokens exactly."""

from __future__ import annotations

import random

import numpy as np

from load_gen.frames import Frame

NOISE_DBFS = -30.0  # a synthetic load's audio for an audio-in model: white noise at this RMS


def planned_arrivals(kind: str, sessions: int, arrival_rate: float | None, duration_s: float,
                     seed: int, frame_ms: float) -> list[float]:
    """arrival_times of a generated load, from its settings alone (no folder or device is
    touched), so a replay can recompute a recorded run's arrivals exactly."""
    if kind == "fixed":
        return [0.0] * sessions
    if kind == "mic":
        return [0.0]  # one live session per microphone, whatever --sessions says
    if kind == "wav":
        # Phase-staggered evenly over one frame period. The runtime keeps these phases with
        # --stagger; without it every arrival waits for the next tick (session 0 at tick 0, the
        # rest at tick 1).
        frame_s = frame_ms / 1e3
        return [t for t in (i / sessions * frame_s for i in range(sessions)) if t < duration_s]
    if kind == "ramp":
        # Evenly spaced; without a rate the ramp spans the first half of the run.
        gap = 1.0 / arrival_rate if arrival_rate else duration_s / 2 / sessions
        return [i * gap for i in range(sessions) if i * gap < duration_s]
    if kind != "poisson":
        raise ValueError(f"load {kind!r} has no planned arrivals")
    rng = random.Random(seed)
    times, t = [], 0.0
    while len(times) < sessions:
        t += rng.expovariate(arrival_rate)
        if t >= duration_s:
            break
        times.append(t)
    return times


class SyntheticFrames:
    """Per-session token frames: seeded random ids, so runs are reproducible. For an audio-in
    model (`audio_samples` > 0) each frame also carries seeded white noise at NOISE_DBFS: a
    synthetic load has no speech, and says so (`input_feed`)."""

    end_reason: str | None = None  # FrameSource: it ends when its frames do ("source ended")

    def __init__(self, session_seed: int, vocab_size: int, tokens_in: int,
                 audio_samples: int = 0) -> None:
        if tokens_in < 1:
            raise ValueError(f"tokens in {tokens_in} must be ≥ 1")
        if vocab_size < 2:
            raise ValueError(f"vocab size {vocab_size} must be ≥ 2")
        if audio_samples < 0:
            raise ValueError(f"audio samples {audio_samples} per frame must be ≥ 0")
        self._rng = random.Random(session_seed)
        self._noise = np.random.default_rng(session_seed) if audio_samples else None
        self._samples = audio_samples
        self._vocab = vocab_size
        self._n = tokens_in
        self._index = 0

    def next_frame(self, frame_s: float = 0.0) -> Frame | None:
        """The next frame, or None when the source has ended (never, for synthetic load)."""
        audio = None
        if self._noise is not None:
            scale = 10 ** (NOISE_DBFS / 20)  # RMS of the noise, full scale 1.0
            audio = (self._noise.standard_normal(self._samples) * scale).astype(np.float32)
        frame = Frame(self.draw(self._n), self._index * frame_s, audio=audio)
        self._index += 1
        return frame

    def draw(self, n: int) -> list[int]:
        """The next n token ids of this session's stream (a replay draws a recorded count)."""
        # Id 0 is the special end-of-text token of the bundled tokenizers: avoid it.
        return [self._rng.randrange(1, self._vocab) for _ in range(n)]

    def close(self) -> None:
        """Nothing to release."""


def session_seed(seed: int, session_id: int) -> int:
    """The token stream's seed of one session of a seeded load (synthetic and replay alike)."""
    return seed * 100_003 + session_id


