"""The load: when sessions arrive (fixed, ramp, Poisson, WAV replay, microphone, gateway) and
each session's frame source; synthetic token frames live here, audio sources in wav.py, mic.py
and remote.py (a gateway client's audio: its sessions arrive when clients connect)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from load_gen import mic, wav
from load_gen.frames import FrameSource
from load_gen.generated import NOISE_DBFS, SyntheticFrames, planned_arrivals, session_seed
from load_gen.tokenizer import frame_tokenizer

LOADS = ("fixed", "ramp", "poisson", "wav", "mic", "replay", "gateway")
AUDIO_LOADS = ("wav", "mic", "gateway")
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
        elif self.kind == "mic":
            mic.system_input(self.mic_device, self.sample_rate_hz)


    def _check_replay(self) -> None:
        if self.kind != "replay":
            given = self.replay_run or self.replay_trace or self.replay_db
            raise ValueError(f"replay source {given} only applies to load replay")
        if (self.replay_run is None) == (self.replay_trace is None):
            raise ValueError("load replay needs exactly one of --replay-run (a recorded run) "
                             "or --replay-trace (a CSV or Parquet file)")


def _replayed(trace):
    if trace is None:
        raise ValueError("a replay load offers its trace: read it first (runtime.trace_source)")
    return trace


def arrival_times(cfg: LoadConfig, trace=None) -> list[float]:
    """Seconds from run start at which each offered session arrives (sorted, < duration), in
    session-id order: the runtime numbers sessions by their index here. A replay load's come
    from its `trace` (load_gen.trace_load.ReplayTrace)."""
    if cfg.kind == "replay":
        return list(_replayed(trace).arrivals)
    if cfg.kind == "gateway":
        return []  # clients arrive when they connect (runtime/remote.py)
    return planned_arrivals(cfg.kind, cfg.sessions, cfg.arrival_rate, cfg.duration_s, cfg.seed,
                            cfg.frame_ms)


def input_feed(kind: str, audio_in: bool) -> str:
    """What a load of `kind` feeds a model, said plainly (a run's summary shows it): an
    audio-in model (`audio_in`) hears audio; a text model reads ids, stand-ins for audio."""
    if audio_in:
        if kind in AUDIO_LOADS:
            return f"{kind} audio through the model's audio encoder"
        return (f"seeded white noise at {NOISE_DBFS:g} dBFS through the model's audio encoder "
                f"(load {kind} has no speech)")
    if kind in AUDIO_LOADS:
        return (f"{kind} audio as stand-in token ids (each slice's log-mel hashed into the top "
                "of the vocabulary; the model never learnt them)")
    if kind == "replay":
        return "recorded token counts as seeded random token ids"
    return "seeded random token ids"


def make_frame_source(load: LoadConfig, session_id: int, vocab_size: int,
                      tokens_in: int, trace=None, audio: bool = False) -> FrameSource:
    """The frame source of one session of this load (a replay's from its `trace`); `audio`:
    the model takes audio, so a synthetic load's frames carry noise audio as well."""
    if load.kind == "replay":
        from load_gen.trace_load import ReplayFrames

        return ReplayFrames(_replayed(trace), session_id, load.seed, vocab_size)
    if load.kind == "gateway":
        raise ValueError("a gateway session's frames come from its client (load_gen.remote)")
    if load.kind not in AUDIO_LOADS:
        samples = round(load.sample_rate_hz * load.frame_ms / 1e3) if audio else 0
        return SyntheticFrames(session_seed(load.seed, session_id), vocab_size, tokens_in,
                               samples)
    tokenizer = frame_tokenizer(load.sample_rate_hz, load.frame_ms, tokens_in, vocab_size)
    if load.kind == "wav":
        clips = wav.load_folder(load.wav_dir, load.sample_rate_hz)
        return wav.WavFrames(clips[session_id % len(clips)], tokenizer, load.wav_loop)
    return mic.MicFrames(tokenizer, mic.system_input(load.mic_device, load.sample_rate_hz))
