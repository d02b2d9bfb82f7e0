"""WAV replay: a folder of WAV files becomes sessions, paced by the metronome, not by the file.

Session i replays file i mod F of the folder's F files (sorted by name), so `--sessions` keeps its
meaning (sessions offered) and a few recordings can load hundreds of sessions. Each file is decoded
and resampled to the model rate once per process and shared read-only by its sessions. A session
reads one frame of samples per call, whenever the runtime calls; with `loop` it wraps to the
start at the file's end, without it the last frame is padded with silence and the session ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from load_gen.audio import read_wav, resample, voice_active
from load_gen.frames import Frame
from load_gen.tokenizer import FrameTokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Clip:
    name: str
    samples: np.ndarray = field(repr=False, compare=False)  # mono float32 at sample_rate_hz
    sample_rate_hz: int
    source_rate_hz: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate_hz


def load_folder(wav_dir: str, sample_rate_hz: int) -> tuple[Clip, ...]:
    """Every .wav file of the folder (not its subfolders), sorted by name, at the model rate.
    Raises ValueError for a missing or empty folder and for any unreadable file."""
    folder = Path(wav_dir)
    if not folder.exists():
        raise ValueError(f"WAV folder {wav_dir} does not exist")
    if not folder.is_dir():
        raise ValueError(f"WAV folder {wav_dir} is not a folder")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".wav" and p.is_file())
    if not paths:
        raise ValueError(f"WAV folder {wav_dir} has no .wav files")
    root = folder.resolve()
    clips = []
    for p in paths:
        if not p.resolve().is_relative_to(root):
            # A link out of the folder would let a named folder read any file on the machine.
            raise ValueError(f"WAV file {p.name} links outside {wav_dir}; copy it into the folder")
        st = p.stat()
        # Size and mtime in the key: a file rewritten in place is decoded again.
        clips.append(_load_clip(str(p.resolve()), st.st_mtime_ns, st.st_size, sample_rate_hz))
    return tuple(clips)


@lru_cache(maxsize=256)
def _load_clip(path: str, mtime_ns: int, size: int, sample_rate_hz: int) -> Clip:
    samples, rate_hz = read_wav(path)
    samples = resample(samples, rate_hz, sample_rate_hz)
    samples.flags.writeable = False  # shared by every session that replays the file
    logger.info("WAV %s: %.2f s at %d Hz, replayed at %d Hz", Path(path).name,
                len(samples) / sample_rate_hz, rate_hz, sample_rate_hz)
    return Clip(Path(path).name, samples, sample_rate_hz, rate_hz)


class WavFrames:
    """One session replaying one clip (a FrameSource)."""

    end_reason: str | None = None  # FrameSource: it ends when its frames do ("source ended")

    def __init__(self, clip: Clip, tokenizer: FrameTokenizer, loop: bool) -> None:
        if clip.sample_rate_hz != tokenizer.sample_rate_hz:
            raise ValueError(f"clip {clip.name} is at {clip.sample_rate_hz} Hz, the tokenizer "
                             f"at {tokenizer.sample_rate_hz} Hz")
        self.clip = clip
        self._tokenizer = tokenizer
        self._loop = loop
        self._pos = 0  # next sample to read

    def next_frame(self, frame_s: float) -> Frame | None:
        self._tokenizer.check_period(frame_s)
        samples, n = self.clip.samples, self._tokenizer.frame_samples
        start = self._pos
        if self._loop:
            audio = np.take(samples, np.arange(start, start + n), mode="wrap")
            self._pos = (start + n) % len(samples)
        else:
            if start >= len(samples):
                return None
            audio = samples[start:start + n]
            if len(audio) < n:
                audio = np.concatenate([audio, np.zeros(n - len(audio), np.float32)])
            self._pos = start + n
        return Frame(self._tokenizer.tokenize(audio).tolist(), start / self.clip.sample_rate_hz,
                     voice_active(audio), audio)

    def close(self) -> None:
        """Nothing to release: the clip is shared and stays cached."""
