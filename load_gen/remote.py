"""A remote client's audio as a frame source: PCM16 appended by a connection thread, cut into
frames at the run's frame period by the run thread, through the same tokenizer as WAV and mic.

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

import numpy as np

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
        self.samples_in = 0

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

    def append(self, samples: np.ndarray) -> None:
        """Buffer the client's samples (float32 at the tokenizer's rate)."""
        now = time.perf_counter()
        with self._lock:
            if self.end_reason is not None:
                return  # the session is over: late audio has nowhere to go
            if self._buffered + len(samples) > self._max_samples:
                ahead_s = (self._buffered + len(samples)) / self._tokenizer.sample_rate_hz
                raise BufferFull(
                    f"buffered audio would reach {ahead_s:.2f} s, above the "
                    f"{self._max_samples / self._tokenizer.sample_rate_hz:g} s allowed: "
                    "send audio at real time")
            self._chunks.append(samples)
            self._buffered += len(samples)
            self.samples_in += len(samples)
            self.last_append_at = now
            if self.first_full_at is None and self.samples_in >= self.frame_samples:
                self.first_full_at = now

    def end(self, reason: str) -> None:
        """No more audio will come (the client closed, disconnected or was closed)."""
        with self._lock:
            if self.end_reason is None:
                self.end_reason = reason

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
        idx = self._next_idx
        self._next_idx += 1
        return Frame(self._tokenizer.tokenize(audio).tolist(), idx * frame_s,
                     voice_active(audio), audio)

    def _take(self, n: int) -> np.ndarray:
        joined = np.concatenate(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        audio, rest = joined[:n], joined[n:]
        self._chunks = [rest] if len(rest) else []
        self._buffered -= n
        return audio

    def close(self) -> None:
        self.end("closed")
