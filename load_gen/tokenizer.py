"""Audio frame tokenizer: a stand-in for an interaction model's audio codec.

A real interaction model turns each frame of audio into a fixed number of token ids: Moshi's Mimi
codec emits 8 codebook ids per 80 ms frame, Qwen-Omni's audio encoder 25 tokens per second. What
matters for serving is that rate and that the ids are real vocabulary ids, not what they mean, so
this tokenizer copies the rate and fakes the codes:

- the frame is cut into `tokens_in` equal slices, one token each (the codec's token rate);
- each slice gets a log-mel spectrum from a 25 ms Hann window centred on it (the usual speech
  front-end; a window longer than its slice overlaps its neighbours, as real front-ends do);
- the spectrum is quantized by a fixed random-hyperplane codebook (locality-sensitive hashing):
  similar spectra share ids, digital silence always maps to one id, like a VQ codebook;
- ids occupy the top `codebook_size` ids of the model's vocabulary, where omni models put their
  audio tokens; id 0 (the bundled tokenizers' special token) is never produced.

It is not a codec: a model never learnt these ids, and they cannot be decoded back to audio.
Deterministic: the codebook comes from a fixed seed, and the same audio gives the same ids.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

ANALYSIS_MS = 25.0
N_MELS = 24
MAX_CODEBOOK_BITS = 11  # 2048 codes, Mimi's codebook size
_CODEBOOK_SEED = 20_250_801
# Log-mel levels (dB re a full-scale signal) are centred and scaled before hashing, so that the
# hyperplanes through the origin split the range speech occupies rather than all passing by it.
_CENTRE_DB, _SCALE_DB, _FLOOR_DB = -50.0, 20.0, -90.0


class FrameTokenizer:
    """`tokenize(frame)` → `tokens_in` ids in [vocab_size − codebook_size, vocab_size)."""

    def __init__(self, sample_rate_hz: int, frame_ms: float, tokens_in: int,
                 vocab_size: int) -> None:
        if sample_rate_hz < 1000:
            raise ValueError(f"sample rate {sample_rate_hz} Hz must be ≥ 1000")
        self.frame_samples = round(sample_rate_hz * frame_ms / 1e3)
        if self.frame_samples < 1:
            raise ValueError(f"frame period {frame_ms} ms holds no sample at {sample_rate_hz} Hz")
        if tokens_in < 1:
            raise ValueError(f"tokens in {tokens_in} must be ≥ 1")
        if vocab_size < 2:
            raise ValueError(f"vocab size {vocab_size} must be ≥ 2")
        self.sample_rate_hz = sample_rate_hz
        self.tokens_in = tokens_in
        bits = min(MAX_CODEBOOK_BITS, int(math.log2(vocab_size - 1)))
        self.codebook_size = 1 << bits
        self.first_id = vocab_size - self.codebook_size

        n = self.frame_samples
        hop = n / tokens_in
        width = min(n, max(math.ceil(hop), round(sample_rate_hz * ANALYSIS_MS / 1e3)))
        centres = (np.arange(tokens_in) + 0.5) * hop
        starts = np.clip(np.round(centres - width / 2).astype(int), 0, n - width)
        self._index = starts[:, None] + np.arange(width)[None, :]  # (tokens_in, width)
        self._window = np.hanning(width + 2)[1:-1].astype(np.float32)  # no zero end points
        self._n_fft = 1 << max(1, math.ceil(math.log2(width)))
        # Power in dBFS like audio.level_dbfs: a full-scale sine reads about -1 dB in its band.
        norm = 2.0 / float(self._window.sum()) ** 2
        self._mel = (_mel_filters(sample_rate_hz, self._n_fft, N_MELS) * norm).astype(np.float32)
        rng = np.random.default_rng(_CODEBOOK_SEED)
        self._planes = rng.standard_normal((N_MELS, bits)).astype(np.float32)
        self._weights = (1 << np.arange(bits)).astype(np.int64)

    @property
    def frame_s(self) -> float:
        return self.frame_samples / self.sample_rate_hz

    def check_period(self, frame_s: float) -> None:
        """Sources cut frames of this tokenizer's length: the caller's period must be it (to
        half a sample, the rounding of frame_ms to whole samples)."""
        if abs(frame_s - self.frame_s) > 0.5 / self.sample_rate_hz:
            raise ValueError(f"frame period {frame_s * 1e3:g} ms differs from the "
                             f"{self.frame_s * 1e3:g} ms this source was built for")

    def tokenize(self, frame: np.ndarray) -> np.ndarray:
        """The frame's ids (int64, length tokens_in); `frame` is frame_samples of float audio."""
        if frame.shape != (self.frame_samples,):
            raise ValueError(f"frame of shape {frame.shape} is not ({self.frame_samples},) "
                             f"samples at {self.sample_rate_hz} Hz")
        slices = frame.astype(np.float32, copy=False)[self._index] * self._window
        spectrum = np.fft.rfft(slices, n=self._n_fft)
        power = spectrum.real ** 2 + spectrum.imag ** 2
        mel_db = 10.0 * np.log10(np.maximum(power @ self._mel, 10 ** (_FLOOR_DB / 10)))
        features = (mel_db - _CENTRE_DB) / _SCALE_DB
        codes = ((features @ self._planes) > 0) @ self._weights
        return self.first_id + codes


def _mel_filters(sample_rate_hz: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Triangular mel filters (HTK mel scale), shape (n_fft // 2 + 1, n_mels)."""
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(0.0), mel(sample_rate_hz / 2), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, 1.0 / sample_rate_hz)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling)).T


@lru_cache(maxsize=32)
def frame_tokenizer(sample_rate_hz: int, frame_ms: float, tokens_in: int,
                    vocab_size: int) -> FrameTokenizer:
    """A shared tokenizer per setting: it holds no per-session state, and hundreds of sessions
    need not each build their own filterbank."""
    return FrameTokenizer(sample_rate_hz, frame_ms, tokens_in, vocab_size)
