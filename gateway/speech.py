"""The load client's audio: a WAV folder's files (session i plays file i mod F, looped) or
synthetic speech, made here so a load needs no recordings.

Synthetic speech is a stand-in with speech's shape where the tokenizer looks (log-mel
spectra, voice vs pause): syllables of a few harmonics of a gliding pitch, 4–6 per second,
in phrases of 1–2.5 s separated by pauses of 0.2–0.7 s. It says nothing.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from load_gen.wav import load_folder

SYNTHETIC_S = 8.0  # a session loops this much synthetic speech


def session_audio(session_id: int, seed: int, rate_hz: int, wav_dir: str | None) -> np.ndarray:
    """The float32 mono samples session `session_id` sends (looped by the caller)."""
    if wav_dir is not None:
        clips = load_folder(wav_dir, rate_hz)
        return clips[session_id % len(clips)].samples
    return synthetic_speech(seed * 100_003 + session_id, rate_hz)


@lru_cache(maxsize=64)
def synthetic_speech(seed: int, rate_hz: int, seconds: float = SYNTHETIC_S) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * rate_hz), np.float32)
    pos = int(rng.uniform(0.0, 0.3) * rate_hz)
    while pos < len(out):
        phrase = int(rng.uniform(1.0, 2.5) * rate_hz)
        seg = min(phrase, len(out) - pos)
        t = np.arange(seg) / rate_hz
        f0 = rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.3, 1) * t))
        phase = 2 * np.pi * np.cumsum(f0) / rate_hz
        voice = sum(np.sin(h * phase) / h for h in range(1, 6))
        syllables = 0.5 * (1 - np.cos(2 * np.pi * rng.uniform(4, 6) * t))  # 4–6 Hz envelope
        noise = rng.standard_normal(seg) * 0.02
        out[pos:pos + seg] = (0.15 * voice * syllables + noise).astype(np.float32)
        pos += seg + int(rng.uniform(0.2, 0.7) * rate_hz)
    out.flags.writeable = False
    return out
