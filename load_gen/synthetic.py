"""The load: when sessions arrive (fixed, ramp, Poisson, WAV replay, microphone) and each
session's frame source; synthetic token frames live here, audio sources in wav.py and mic.py."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from load_gen import mic, wav
from load_gen.frames import Frame, FrameSource
from load_gen.tokenizer import frame_tokenizer

LOADS = ("fixed", "ramp", "poisson", "wav", "mic")
AUDIO_LOADS = ("wav", "mic")
MIN_AUDIO_FRAME_MS = 10.0  # codecs frame at 10 ms or more; shorter frames hold too few samples


@dataclass(frozen=True)
class LoadConfig:
    kind: str = "fixed"
    sessions: int = 8  # fixed: N at once; ramp/poisson: total offered
    arrival_rate: float | None = None  # sessions per second (ramp, poisson)
    session_s: float | None = None  # session length; None: until the run ends
    duration_s: float = 10.0
    seed: int = 0
    frame_ms: float = 80.0  # the frame period: audio sources cut and tokenize frames of it
    wav_dir: str | None = None  # wav: session i replays file i mod F of this folder
    wav_loop: bool = True  # wav: wrap to the start at the file's end (else the session ends)
    mic_device: str | None = None  # mic: PortAudio input index or name; None: the default
    sample_rate_hz: int = 16_000  # audio loads: the model's input rate

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
        if not (math.isfinite(self.frame_ms) and self.frame_ms > 0):
            raise ValueError(f"frame period {self.frame_ms} ms must be > 0")
        if self.wav_dir is not None and self.kind != "wav":
            raise ValueError(f"wav dir {self.wav_dir} only applies to load wav")
        if self.mic_device is not None and self.kind != "mic":
            raise ValueError(f"mic device {self.mic_device!r} only applies to load mic")
        if self.kind in AUDIO_LOADS:
            self._check_audio()

    def _check_audio(self) -> None:
        if self.frame_ms < MIN_AUDIO_FRAME_MS:
            raise ValueError(f"frame period {self.frame_ms} ms is too short for load "
                             f"{self.kind} (≥ {MIN_AUDIO_FRAME_MS:g} ms)")
        if not 8_000 <= self.sample_rate_hz <= 192_000:
            raise ValueError(f"sample rate {self.sample_rate_hz} Hz must be in [8000, 192000]")
        if self.kind == "wav":
            if self.wav_dir is None:
                raise ValueError("load wav needs --wav-dir (a folder of .wav files)")
            wav.load_folder(self.wav_dir, self.sample_rate_hz)  # decoded once, then cached
        else:
            mic.system_input(self.mic_device, self.sample_rate_hz)


def arrival_times(cfg: LoadConfig) -> list[float]:
    """Seconds from run start at which each offered session arrives (sorted, < duration)."""
    if cfg.kind == "fixed":
        return [0.0] * cfg.sessions
    if cfg.kind == "mic":
        return [0.0]  # one live session per microphone, whatever --sessions says
    if cfg.kind == "wav":
        # Phase-staggered evenly over one frame period. The runtime keeps these phases with
        # --stagger; without it every arrival waits for the next tick (session 0 at tick 0, the
        # rest at tick 1).
        frame_s = cfg.frame_ms / 1e3
        return [t for t in (i / cfg.sessions * frame_s for i in range(cfg.sessions))
                if t < cfg.duration_s]
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

    def close(self) -> None:
        """Nothing to release."""


def make_frame_source(load: LoadConfig, session_id: int, vocab_size: int,
                      tokens_in: int) -> FrameSource:
    """The frame source of one session of this load."""
    if load.kind not in AUDIO_LOADS:
        return SyntheticFrames(load.seed * 100_003 + session_id, vocab_size, tokens_in)
    tokenizer = frame_tokenizer(load.sample_rate_hz, load.frame_ms, tokens_in, vocab_size)
    if load.kind == "wav":
        clips = wav.load_folder(load.wav_dir, load.sample_rate_hz)
        return wav.WavFrames(clips[session_id % len(clips)], tokenizer, load.wav_loop)
    return mic.MicFrames(tokenizer, mic.system_input(load.mic_device, load.sample_rate_hz))
