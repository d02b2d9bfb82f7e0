"""Audio primitives: decode a WAV file to mono float32, resample it, tell voice from silence.

numpy only. The stdlib `wave` module of Python 3.11 rejects WAVE_FORMAT_EXTENSIBLE, which sox and
most recorders write for 24-bit, float or multichannel audio, so the RIFF chunks are read here.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

# Frames whose level (DC removed) is below this are silence. A fixed energy gate: speech at a
# normal distance sits around -30..-15 dBFS, a quiet room through a laptop microphone around
# -60..-50 dBFS. It is a stand-in for a trained VAD, good enough to mark speech vs pauses.
VAD_THRESHOLD_DBFS = -45.0
_SILENCE_DBFS = -120.0  # the level reported for digital silence (log of zero)

_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """(samples, sample_rate_hz): mono float32 in [-1, 1] (channels averaged).

    Integer PCM of 8/16/24/32 bits and float of 32/64 bits, plain or extensible. Raises ValueError
    naming the file and what is wrong with it.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"WAV file {path} cannot be read: {exc.strerror or exc}") from None
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"WAV file {path} is not a RIFF/WAVE file")
    fmt, payload = _chunks(path, data)
    channels, rate_hz, bits, encoding = fmt
    width = bits // 8
    usable = len(payload) - len(payload) % (width * channels)
    if usable == 0:
        raise ValueError(f"WAV file {path} has no audio samples")
    raw = payload[:usable]
    if encoding == _FLOAT:
        samples = np.frombuffer(raw, dtype=f"<f{width}").astype(np.float32)
    elif bits == 8:  # 8-bit WAV is unsigned, centred on 128
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8  # sign-extend 24 bits
        samples = ints.astype(np.float32) / float(1 << 23)
    else:
        ints = np.frombuffer(raw, dtype=f"<i{width}")
        samples = (ints / float(1 << (bits - 1))).astype(np.float32)
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1, dtype=np.float32)
    return samples, rate_hz


def _chunks(path: Path, data: bytes) -> tuple[tuple[int, int, int, int], bytes]:
    """The fmt fields (channels, rate, bits, encoding) and the data chunk's bytes."""
    fmt, payload, pos = None, None, 12
    while pos + 8 <= len(data):
        chunk_id, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = data[pos + 8:pos + 8 + size]  # a truncated last chunk keeps what is there
        if chunk_id == b"fmt ":
            fmt = _parse_fmt(path, body)
        elif chunk_id == b"data":
            payload = body
        pos += 8 + size + (size & 1)  # chunks are word-aligned
    if fmt is None:
        raise ValueError(f"WAV file {path} has no fmt chunk")
    if payload is None:
        raise ValueError(f"WAV file {path} has no data chunk")
    return fmt, payload


def _parse_fmt(path: Path, body: bytes) -> tuple[int, int, int, int]:
    if len(body) < 16:
        raise ValueError(f"WAV file {path} has a truncated fmt chunk")
    encoding, channels, rate_hz, _, _, bits = struct.unpack_from("<HHIIHH", body)
    if encoding == _EXTENSIBLE and len(body) >= 26:
        encoding = struct.unpack_from("<H", body, 24)[0]  # first field of the subformat GUID
    supported = {_PCM: (8, 16, 24, 32), _FLOAT: (32, 64)}
    if bits not in supported.get(encoding, ()):
        raise ValueError(f"WAV file {path} has format 0x{encoding:04x} with {bits} bits; "
                         "16/24/32-bit PCM, 8-bit PCM or 32/64-bit float is supported")
    if channels < 1 or rate_hz < 1:
        raise ValueError(f"WAV file {path} declares {channels} channels at {rate_hz} Hz")
    return channels, rate_hz, bits, encoding


def resample(samples: np.ndarray, rate_in_hz: int, rate_out_hz: int) -> np.ndarray:
    """Band-limited resampling by the FFT: exact for a periodic signal, which a looping replay
    is; at the ends of a non-looping file it rings for a few milliseconds, which is harmless for
    replay. Output length is round(n · rate_out / rate_in)."""
    if rate_in_hz == rate_out_hz:
        return samples.astype(np.float32, copy=False)
    n_in = len(samples)
    n_out = max(1, round(n_in * rate_out_hz / rate_in_hz))
    spectrum = np.fft.rfft(samples.astype(np.float64))
    keep = min(len(spectrum), n_out // 2 + 1)
    out_spectrum = np.zeros(n_out // 2 + 1, dtype=np.complex128)
    out_spectrum[:keep] = spectrum[:keep]
    if n_out < n_in and n_out % 2 == 0:
        # The new Nyquist bin holds both ±f of the old spectrum: keep its real, even part.
        out_spectrum[-1] = out_spectrum[-1].real
    return (np.fft.irfft(out_spectrum, n_out) * (n_out / n_in)).astype(np.float32)


def level_dbfs(frame: np.ndarray) -> float:
    """RMS level in dB relative to full scale (a full-scale square wave is 0 dBFS), with the DC
    offset removed first so a biased microphone does not read as speech."""
    if len(frame) == 0:
        return _SILENCE_DBFS
    x = frame - frame.mean(dtype=np.float64)
    power = float(np.dot(x, x)) / len(x)
    return 10.0 * math.log10(power) if power > 0 else _SILENCE_DBFS


def voice_active(frame: np.ndarray, threshold_dbfs: float = VAD_THRESHOLD_DBFS) -> bool:
    return level_dbfs(frame) >= threshold_dbfs
