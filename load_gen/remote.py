"""A remote client's audio as a frame source: PCM16 appended by a connection thread, cut into
frames at the run's frame period and tokenized there, through the same tokenizer as WAV and
mic; the run thread only takes the frames that are ready.

A client may send at another rate than the tokenizer's (the Realtime API's PCM is 24 kHz):
each whole frame of its audio is resampled on its own (soxr) as it completes, then tokenized,
on the connection's thread (`AudioCutter`), so the run thread pays for neither and frame k is
still exactly the client's samples [k·n, (k+1)·n) at its rate. A gateway worker process cuts
frames with its own `AudioCutter` and hands the run process the result (`RemoteFrames.push`).
Text the client adds between frames (a conversation item, already ids) goes in front of its
next frame's tokens.

Unlike the microphone, nothing is dropped or padded to keep pace: a client's frame k is exactly
its samples [k·n, (k+1)·n), so the client and the server name the same audio by the same index.
When the run thread comes for a frame the client has not finished sending, the period is idle
(`IDLE`: a frame with no tokens, which the runtime neither submits nor records) and counted as
an underrun. Buffered audio is bounded: a client that sends faster than real time fills it and
gets `BufferFull`, not an ever-growing queue.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import numpy as np
import soxr

from load_gen.audio import voice_active
from load_gen.frames import Frame
from load_gen.tokenizer import FrameTokenizer

# An idle period: the client owes the audio. No tokens, so the runtime submits nothing.
IDLE = Frame([], 0.0, False)


class BufferFull(ValueError):
    """The client is ahead of real time by more than the bound; the message says by how much."""


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Little-endian 16-bit PCM (what the Realtime API calls pcm16) as float32 in [-1, 1)."""
    if len(data) % 2:
        raise ValueError(f"PCM16 audio of {len(data)} bytes is not a whole number of samples")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def buffer_full(ahead_s: float, max_s: float) -> str:
    return (f"buffered audio would reach {ahead_s:.2f} s, above the {max_s:g} s allowed: "
            "send audio at real time")


class AudioCutter:
    """One client's audio at its rate → whole frames at the tokenizer's rate, each resampled
    on its own and tokenized as it completes. One thread (the connection's) calls it."""

    def __init__(self, tokenizer: FrameTokenizer) -> None:
        self.tokenizer = tokenizer
        self.rate_hz = tokenizer.sample_rate_hz  # the client's rate (set before its audio)
        self.samples_in = 0  # at the client's rate
        self._pending = np.zeros(0, np.float32)  # the client's partial frame, at its rate
        self.frames_cut = 0
        # One resampler kept and cleared per frame: the same output as soxr.resample on the
        # frame alone (each frame on its own), without building its filter every 80 ms.
        self._resampler: soxr.ResampleStream | None = None

    @property
    def frame_samples_in(self) -> int:
        """One frame at the client's rate."""
        return round(self.tokenizer.frame_samples * self.rate_hz / self.tokenizer.sample_rate_hz)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def set_rate(self, rate_hz: int) -> None:
        """The client's PCM rate; only before its first sample (frames are cut at one rate)."""
        if not 8_000 <= rate_hz <= 48_000:
            raise ValueError(f"input rate {rate_hz} Hz must be in [8000, 48000]")
        if rate_hz != self.rate_hz and self.samples_in:
            raise ValueError(f"input rate {rate_hz} Hz: the session's audio started at "
                             f"{self.rate_hz} Hz and cannot change rate")
        if rate_hz != self.rate_hz:
            self._resampler = None
        self.rate_hz = rate_hz

    def cut(self, samples: np.ndarray) -> list[Frame]:
        """The whole frames these samples complete (t_media_s 0: the taker numbers them)."""
        self.samples_in += len(samples)
        joined = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        n_in, n = self.frame_samples_in, self.tokenizer.frame_samples
        whole = len(joined) // n_in
        self._pending = joined[whole * n_in:]
        out = []
        for k in range(whole):
            audio = joined[k * n_in:(k + 1) * n_in]
            if self.rate_hz != self.tokenizer.sample_rate_hz:
                y = self._resample(audio)
                audio = np.zeros(n, np.float32)  # soxr rounds the length: a missing last
                audio[:min(n, len(y))] = y[:n]  # sample is silence
            audio = audio.astype(np.float32, copy=False)
            out.append(Frame(self.tokenizer.tokenize(audio).tolist(), 0.0,
                             voice_active(audio), audio))
        self.frames_cut += whole
        return out

    def _resample(self, frame: np.ndarray) -> np.ndarray:
        if self._resampler is None:
            self._resampler = soxr.ResampleStream(self.rate_hz, self.tokenizer.sample_rate_hz,
                                                  1, dtype="float32", quality="HQ")
        self._resampler.clear()  # nothing of the previous frame: the frame on its own
        return self._resampler.resample_chunk(np.ascontiguousarray(frame, np.float32),
                                              last=True)

    def clear(self) -> int:
        """Drop the partial frame; returns the client's samples dropped."""
        dropped, self._pending = len(self._pending), self._pending[:0]
        return dropped


class RemoteFrames:
    """One client's frames (a FrameSource). `append`, `push` and `end` from any thread (one
    at a time: the client's connection)."""

    def __init__(self, tokenizer: FrameTokenizer, max_buffer_s: float) -> None:
        if not max_buffer_s > 0:
            raise ValueError(f"max buffered audio {max_buffer_s} s must be > 0")
        self._tokenizer = tokenizer
        self.cutter = AudioCutter(tokenizer)
        self._max_s = max(tokenizer.frame_s, max_buffer_s)
        self._lock = threading.Lock()
        self._ready: collections.deque[Frame] = collections.deque()  # cut, not yet taken
        self._next_idx = 0
        self.first_full_at: float | None = None  # wall clock when frame 0 was complete
        self.last_append_at: float | None = None
        self.end_reason: str | None = None  # set by `end`: why the source ends
        self.underruns = 0
        self._text: list[int] = []  # ids to put in front of the next frame's tokens
        # Called (from the appending thread) when a whole frame is buffered or the source
        # ends: a run thread waiting for this client's audio takes it at once.
        self.on_ready: Callable[[], None] | None = None

    @property
    def frame_samples(self) -> int:
        return self._tokenizer.frame_samples

    @property
    def frames_taken(self) -> int:
        return self._next_idx

    @property
    def rate_hz(self) -> int:
        return self.cutter.rate_hz

    @property
    def samples_in(self) -> int:
        return self.cutter.samples_in

    @property
    def frame_samples_in(self) -> int:
        return self.cutter.frame_samples_in

    def backlog(self) -> int:
        """Whole frames buffered (more than none: the client is ahead of its frames)."""
        with self._lock:
            return len(self._ready)

    def set_rate(self, rate_hz: int) -> None:
        self.cutter.set_rate(rate_hz)

    def turn_end(self) -> int:
        """The last whole frame so far, taken or buffered (a commit's turn ends there)."""
        return self.frames_taken + self.backlog() - 1

    def add_text(self, ids: list[int]) -> None:
        """Token ids that go in front of the next frame's (a client's text item)."""
        with self._lock:
            self._text.extend(ids)

    def append(self, samples: np.ndarray) -> None:
        """Buffer the client's samples (float32 at its rate, `rate_hz`)."""
        if self.end_reason is not None:
            return  # the session is over: late audio has nowhere to go
        cutter = self.cutter
        ahead_s = (self.backlog() * self._tokenizer.frame_s
                   + (cutter.pending + len(samples)) / cutter.rate_hz)
        if ahead_s > self._max_s + 0.5 / cutter.rate_hz:
            raise BufferFull(buffer_full(ahead_s, self._max_s))
        self.push(cutter.cut(samples), time.perf_counter())

    def push(self, frames: list[Frame], at: float) -> None:
        """Frames cut from the client's audio (here, or by a gateway worker at `at`)."""
        with self._lock:
            if self.end_reason is not None:
                return
            self.last_append_at = at
            if not frames:
                return
            self._ready.extend(frames)
            if self.first_full_at is None:
                self.first_full_at = at
        if self.on_ready is not None:
            self.on_ready()

    def clear(self) -> int:
        """Drop the audio not yet taken as a frame (input_audio_buffer.clear); returns the
        client's samples dropped."""
        with self._lock:
            dropped = len(self._ready) * self.cutter.frame_samples_in
            self._ready.clear()
        return dropped + self.cutter.clear()

    def end(self, reason: str) -> None:
        """No more audio will come (the client closed, disconnected or was closed)."""
        with self._lock:
            if self.end_reason is not None:
                return
            self.end_reason = reason
        if self.on_ready is not None:
            self.on_ready()

    def next_frame(self, frame_s: float) -> Frame | None:
        self._tokenizer.check_period(frame_s)
        with self._lock:
            if not self._ready:
                if self.end_reason is not None:
                    return None  # a partial last frame was never completed: not a frame
                self.underruns += 1
                return IDLE
            frame = self._ready.popleft()
            text, self._text = self._text, []
        idx = self._next_idx
        self._next_idx += 1
        return Frame(text + frame.token_ids, idx * frame_s, frame.voice_active, frame.audio)

    def close(self) -> None:
        self.end("closed")
