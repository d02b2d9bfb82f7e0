"""A remote client's audio as a frame source: PCM16 appended by a connection thread, cut into
frames at the run's frame period by the run thread, through the same tokenizer as WAV and mic.

A client may send at another rate than the tokenizer's (the Realtime API's PCM is 24 kHz):
each whole frame of its audio is resampled on its own (soxr) as it completes, on the
connection's thread, so the run thread pays nothing for it and frame k is still exactly the
client's samples [k·n, (k+1)·n) at its rate. Text the client adds between frames (a
conversation item, already ids) goes in front of its next frame's tokens.

Unlike the microphone, nothing is dropped or padded to keep pace: a client's frame k is exactly
its samples [k·n, (k+1)·n), so the client and the server name the same audio by the same index.
When the run thread comes for a frame the client has not finished sending, the period is idle
(`IDLE`: a frame with no tokens, which the runtime neither submits nor records) and counted as
an underrun. Buffered audio is bounded: a client that sends faster than real time fills it and
gets `BufferFull`, not an ever-growing queue.
"""

from __future__ import annotations

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


class RemoteFrames:
    """One client's frames (a FrameSource). `append` and `end` from any thread."""

    def __init__(self, tokenizer: FrameTokenizer, max_buffer_s: float) -> None:
        if not max_buffer_s > 0:
            raise ValueError(f"max buffered audio {max_buffer_s} s must be > 0")
        self._tokenizer = tokenizer
        self._max_samples = max(tokenizer.frame_samples,
                                round(max_buffer_s * tokenizer.sample_rate_hz))
        self._lock = threading.Lock()
        self._chunks: list[np.ndarray] = []
        self._buffered = 0
        self._next_idx = 0
        self.first_full_at: float | None = None  # wall clock when frame 0 was complete
        self.last_append_at: float | None = None
        self.end_reason: str | None = None  # set by `end`: why the source ends
        self.underruns = 0
        self.samples_in = 0  # at the client's rate
        self.rate_hz = tokenizer.sample_rate_hz  # the client's rate (set before its audio)
        self._pending = np.zeros(0, np.float32)  # the client's partial frame, at its rate
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

    def backlog(self) -> int:
        """Whole frames buffered (more than none: the client is ahead of its frames)."""
        with self._lock:
            return self._buffered // self.frame_samples

    @property
    def frame_samples_in(self) -> int:
        """One frame at the client's rate."""
        return round(self.frame_samples * self.rate_hz / self._tokenizer.sample_rate_hz)

    def set_rate(self, rate_hz: int) -> None:
        """The client's PCM rate; only before its first sample (frames are cut at one rate)."""
        if not 8_000 <= rate_hz <= 48_000:
            raise ValueError(f"input rate {rate_hz} Hz must be in [8000, 48000]")
        with self._lock:
            if rate_hz != self.rate_hz and self.samples_in:
                raise ValueError(f"input rate {rate_hz} Hz: the session's audio started at "
                                 f"{self.rate_hz} Hz and cannot change rate")
            self.rate_hz = rate_hz

    def add_text(self, ids: list[int]) -> None:
        """Token ids that go in front of the next frame's (a client's text item)."""
        with self._lock:
            self._text.extend(ids)

    def append(self, samples: np.ndarray) -> None:
        """Buffer the client's samples (float32 at its rate, `rate_hz`)."""
        now = time.perf_counter()
        model_hz = self._tokenizer.sample_rate_hz
        with self._lock:
            if self.end_reason is not None:
                return  # the session is over: late audio has nowhere to go
            if self._buffered + round((len(self._pending) + len(samples)) * model_hz
                                      / self.rate_hz) > self._max_samples:
                ahead_s = (self._buffered / model_hz
                           + (len(self._pending) + len(samples)) / self.rate_hz)
                raise BufferFull(
                    f"buffered audio would reach {ahead_s:.2f} s, above the "
                    f"{self._max_samples / model_hz:g} s allowed: send audio at real time")
            self.samples_in += len(samples)
            self.last_append_at = now
            if self.rate_hz != model_hz:
                samples = self._whole_frames(samples)
                if not len(samples):
                    return
            self._chunks.append(samples)
            self._buffered += len(samples)
            ready = self._buffered >= self.frame_samples
            if self.first_full_at is None and ready:
                self.first_full_at = now
        if ready and self.on_ready is not None:
            self.on_ready()

    def _whole_frames(self, samples: np.ndarray) -> np.ndarray:
        """The client's whole frames so far, each resampled on its own to the model's rate;
        the rest waits for its frame's end."""
        joined = np.concatenate([self._pending, samples]) if len(self._pending) else samples
        n_in, n = self.frame_samples_in, self.frame_samples
        whole = len(joined) // n_in
        self._pending = joined[whole * n_in:]
        if not whole:
            return joined[:0]
        frames = joined[:whole * n_in].reshape(whole, n_in)
        out = np.empty((whole, n), np.float32)
        for k in range(whole):
            y = soxr.resample(frames[k], self.rate_hz, self._tokenizer.sample_rate_hz)
            out[k, :min(n, len(y))] = y[:n]
            out[k, len(y):] = 0.0  # soxr rounds the length; a missing last sample is silence
        return out.reshape(-1)

    def clear(self) -> int:
        """Drop the audio not yet taken as a frame (input_audio_buffer.clear); returns the
        client's samples dropped."""
        with self._lock:
            dropped = round(self._buffered * self.rate_hz / self._tokenizer.sample_rate_hz)
            dropped += len(self._pending)
            self._chunks, self._buffered = [], 0
            self._pending = self._pending[:0]
            return dropped

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
        n = self.frame_samples
        with self._lock:
            if self._buffered < n:
                if self.end_reason is not None:
                    return None  # a partial last frame was never completed: not a frame
                self.underruns += 1
                return IDLE
            audio = self._take(n)
            text, self._text = self._text, []
        idx = self._next_idx
        self._next_idx += 1
        return Frame(text + self._tokenizer.tokenize(audio).tolist(), idx * frame_s,
                     voice_active(audio), audio)

    def _take(self, n: int) -> np.ndarray:
        joined = np.concatenate(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        audio, rest = joined[:n], joined[n:]
        self._chunks = [rest] if len(rest) else []
        self._buffered -= n
        return audio

    def close(self) -> None:
        self.end("closed")
