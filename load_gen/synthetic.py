"""Synthetic load: seeded session arrivals (fixed, ramp, Poisson) and token frames."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

LOADS = ("fixed", "ramp", "poisson")


@dataclass(frozen=True)
class LoadConfig:
    kind: str = "fixed"
    sessions: int = 8  # fixed: N at once; ramp/poisson: total offered
    arrival_rate: float | None = None  # sessions per second (ramp, poisson)
    session_s: float | None = None  # session length; None: until the run ends
    duration_s: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in LOADS:
            raise ValueError(f"load {self.kind!r} is not one of {', '.join(LOADS)}")
        if self.sessions < 1 or self.sessions > 100_000:
            raise ValueError(f"sessions {self.sessions} must be in [1, 100000]")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration {self.duration_s} s must be > 0")
        if self.arrival_rate is not None and not (
                math.isfinite(self.arrival_rate) and self.arrival_rate > 0):
            raise ValueError(f"arrival rate {self.arrival_rate} sessions/s must be > 0")
        if self.kind == "poisson" and self.arrival_rate is None:
            raise ValueError("load poisson needs --arrival-rate (sessions/s, > 0)")
        if self.session_s is not None and not (
                math.isfinite(self.session_s) and self.session_s > 0):
            raise ValueError(f"session length {self.session_s} s must be > 0")


def arrival_times(cfg: LoadConfig) -> list[float]:
    """Seconds from run start at which each offered session arrives (sorted, < duration)."""
    if cfg.kind == "fixed":
        return [0.0] * cfg.sessions
    if cfg.kind == "ramp":
        # Evenly spaced; without a rate the ramp spans the first half of the run.
        gap = 1.0 / cfg.arrival_rate if cfg.arrival_rate else cfg.duration_s / 2 / cfg.sessions
        return [i * gap for i in range(cfg.sessions) if i * gap < cfg.duration_s]
    rng = random.Random(cfg.seed)
    times, t = [], 0.0
    while len(times) < cfg.sessions:
        t += rng.expovariate(cfg.arrival_rate)
        if t >= cfg.duration_s:
            break
        times.append(t)
    return times


@dataclass(frozen=True)
class Frame:
    """What a frame source yields once per frame period."""

    token_ids: list[int]
    t_media_s: float  # position in the source's own timeline (audio seconds, frame index·T)
    voice_active: bool = True


class SyntheticFrames:
    """Per-session token frames: seeded random ids, so runs are reproducible."""

    def __init__(self, session_seed: int, vocab_size: int, tokens_in: int) -> None:
        if tokens_in < 1:
            raise ValueError(f"tokens in {tokens_in} must be ≥ 1")
        if vocab_size < 2:
            raise ValueError(f"vocab size {vocab_size} must be ≥ 2")
        self._rng = random.Random(session_seed)
        self._vocab = vocab_size
        self._n = tokens_in
        self._index = 0

    def next_frame(self, frame_s: float = 0.0) -> Frame | None:
        """The next frame, or None when the source has ended (never, for synthetic load)."""
        # Id 0 is the special end-of-text token of the bundled tokenizers: avoid it.
        ids = [self._rng.randrange(1, self._vocab) for _ in range(self._n)]
        frame = Frame(ids, self._index * frame_s)
        self._index += 1
        return frame


def make_frame_source(load: LoadConfig, session_id: int, vocab_size: int, tokens_in: int):
    """The frame source of one session of this load (a FrameSource: `next_frame(frame_s)`)."""
    return SyntheticFrames(load.seed * 100_003 + session_id, vocab_size, tokens_in)
