"""One frame's log-mel, Whisper's recipe without the general feature extractor's machinery.

vLLM's input processor runs the model's `WhisperFeatureExtractor` on every chunk, in the
serving process (on the engine's event-loop thread). For one 80 ms frame its `__call__` spends
most of its time around the maths: `pad()` over a batch of lists, BatchFeature, and a torch STFT
that, with torch's default of one thread per core, waits on a second thread the engine's own
processes hold (benchmarks/audio_profile.py shows the split; docs/benchmarks/audio_model.md).
A frame needs none of the padding: the engine sizes the window to the frame, so every item is
exactly `max_length` samples.

`install()` wraps `WhisperFeatureExtractor.__call__` in this process: a call whose items are
all exactly `max_length` samples long, at the extractor's rate, with no dither and no
normalisation, is computed here (numpy: reflect-padded frames, periodic Hann window, rfft, the
extractor's own mel filters, log10, the clip's max − 8 floor, (x + 4) / 4: Whisper's steps, equal
to the extractor's output within float32 rounding, tests/engine/test_audio_units.py); any other
call goes to the original unchanged.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

logger = logging.getLogger(__name__)

_MARK = "_metronome_frame_log_mel"


@functools.lru_cache(maxsize=8)
def _hann(n_fft: int) -> np.ndarray:
    """torch.hann_window's default (periodic), as Whisper's STFT uses."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)


def frame_log_mel(frames: np.ndarray, mel_filters: np.ndarray, n_fft: int,
                  hop_length: int) -> np.ndarray:
    """(items, samples) float32 audio → (items, n_mels, samples // hop_length) log-mel, each item
    scaled against its own maximum as Whisper scales a clip."""
    if frames.ndim != 2 or frames.shape[1] % hop_length or frames.shape[1] < hop_length:
        raise ValueError(f"frames of shape {frames.shape} must be (items, k·{hop_length}) "
                         f"samples with k ≥ 1")
    half = n_fft // 2
    padded = np.pad(frames, ((0, 0), (half, half)), mode="reflect")
    kept = frames.shape[1] // hop_length  # the STFT's last frame is dropped, as Whisper does
    index = np.arange(n_fft)[None, :] + hop_length * np.arange(kept)[:, None]
    spectrum = np.fft.rfft(padded[:, index] * _hann(n_fft), axis=-1)
    power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)
    mel = power @ mel_filters.astype(np.float32)  # (items, kept, n_mels)
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max(axis=(1, 2), keepdims=True) - 8.0)
    return np.ascontiguousarray(((log + 4.0) / 4.0).transpose(0, 2, 1), dtype=np.float32)


def _frames(extractor, raw_speech, padding, max_length, sampling_rate, do_normalize,
            pad_to_multiple_of, device, kwargs) -> np.ndarray | None:
    """The call's items as one (items, max_length) array when the frame path applies, else
    None (the original extractor takes the call)."""
    if (kwargs or padding != "max_length" or not max_length or do_normalize
            or pad_to_multiple_of or device not in (None, "cpu")
            or sampling_rate != extractor.sampling_rate or extractor.dither
            or max_length % extractor.hop_length):
        return None
    items = raw_speech if isinstance(raw_speech, (list, tuple)) else [raw_speech]
    if not items or not all(isinstance(a, np.ndarray) and a.shape == (max_length,)
                            and a.dtype.kind == "f" for a in items):
        return None
    return np.stack(items).astype(np.float32, copy=False)


def install() -> None:
    """Wrap WhisperFeatureExtractor.__call__ in this process (idempotent)."""
    from transformers import BatchFeature, WhisperFeatureExtractor

    original = WhisperFeatureExtractor.__call__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def call(self, raw_speech, truncation=True, pad_to_multiple_of=None, return_tensors=None,
             return_attention_mask=None, padding="max_length", max_length=None,
             sampling_rate=None, do_normalize=None, device="cpu", **kwargs):
        frames = _frames(self, raw_speech, padding, max_length, sampling_rate, do_normalize,
                         pad_to_multiple_of, device, kwargs)
        if frames is None:
            return original(self, raw_speech, truncation=truncation,
                            pad_to_multiple_of=pad_to_multiple_of, return_tensors=return_tensors,
                            return_attention_mask=return_attention_mask, padding=padding,
                            max_length=max_length, sampling_rate=sampling_rate,
                            do_normalize=do_normalize, device=device, **kwargs)
        data = {"input_features": frame_log_mel(frames, self.mel_filters, self.n_fft,
                                                self.hop_length)}
        if return_attention_mask:  # no padding: every mel frame is the frame's own
            data["attention_mask"] = np.ones((len(frames), max_length // self.hop_length),
                                             np.int32)
        return BatchFeature(data, tensor_type=return_tensors)

    setattr(call, _MARK, True)
    WhisperFeatureExtractor.__call__ = call
    logger.info("frame-sized Whisper log-mel installed in this process")
