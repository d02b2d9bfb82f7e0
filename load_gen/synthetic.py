"""The load: when sessions arrive (fixed, ramp, Poisson, WAV replay, microphone) and each
session's frame source; synthetic token frames live here, audio sources in wav.py and mic.py."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from load_gen import mic, wav
from load_gen.frames import Frame, FrameSource
from load_gen.tokenizer import frame_tokenizer

LOADS = ("fixed", "ramp", "poisson", "wav", "mic", "replay")
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
    replay_run: str | None = None  # replay: a recorded run of this store to re-offer
    replay_trace: str | None = None  # replay: a CSV or Parquet trace file to re-offer
    replay_db: str | None = None  # replay_run's database (None: $METRONOME_DB or the default)
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
        if self.kind == "replay" or self.replay_run or self.replay_trace or self.replay_db:
            self._check_replay()

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


    def _check_replay(self) -> None:
        if self.kind != "replay":
            given = self.replay_run or self.replay_trace or self.replay_db
            raise ValueError(f"replay source {given} only applies to load replay")
        if (self.replay_run is None) == (self.replay_trace is None):
            raise ValueError("load replay needs exactly one of --replay-run (a recorded run) "
                             "or --replay-trace (a CSV or Parquet file)")
        from load_gen import replay  # reads the store or a file: only when a replay is asked for

        replay.trace_for(self)  # read once, then cached


def arrival_times(cfg: LoadConfig) -> list[float]:
    """Seconds from run start at which each offered session arrives (sorted, < duration), in
    session-id order: the runtime numbers sessions by their index here."""
    if cfg.kind == "replay":
        from load_gen import replay

        return list(replay.trace_for(cfg).arrivals)
    return planned_arrivals(cfg.kind, cfg.sessions, cfg.arrival_rate, cfg.duration_s, cfg.seed,
                            cfg.frame_ms)


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
        frame = Frame(self.draw(self._n), self._index * frame_s)
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


def make_frame_source(load: LoadConfig, session_id: int, vocab_size: int,
                      tokens_in: int) -> FrameSource:
    """The frame source of one session of this load."""
    if load.kind == "replay":
        from load_gen import replay

        return replay.ReplayFrames(replay.trace_for(load), session_id, load.seed, vocab_size)
    if load.kind not in AUDIO_LOADS:
        return SyntheticFrames(session_seed(load.seed, session_id), vocab_size, tokens_in)
    tokenizer = frame_tokenizer(load.sample_rate_hz, load.frame_ms, tokens_in, vocab_size)
    if load.kind == "wav":
        clips = wav.load_folder(load.wav_dir, load.sample_rate_hz)
        return wav.WavFrames(clips[session_id % len(clips)], tokenizer, load.wav_loop)
    return mic.MicFrames(tokenizer, mic.system_input(load.mic_device, load.sample_rate_hz))
