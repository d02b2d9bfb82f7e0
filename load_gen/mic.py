"""The live microphone as one session: a PortAudio input stream with a block of one frame.

The stream's callback runs on PortAudio's thread and only copies each block into a bounded queue;
the metronome takes one block per frame period. The device clock and the metronome's drift apart:
when no block is waiting (always at the first frame, whose audio is still being recorded) the
frame is silence, and when blocks pile up the oldest are dropped, so the session stays at most
MAX_QUEUED_FRAMES behind the speaker.

`sounddevice` is imported only here and only when the microphone is asked for; it raises OSError
at import when the PortAudio library is missing, which becomes MicrophoneUnavailable with what to
install. The module object is passed in (`sd=`), which is where tests put a fake stream.
"""

from __future__ import annotations

import importlib
import itertools
import json
import logging
import subprocess
import sys
import weakref
from collections import deque
from functools import lru_cache
from pathlib import Path

import numpy as np

from load_gen.audio import voice_active
from load_gen.frames import Frame
from load_gen.tokenizer import FrameTokenizer

logger = logging.getLogger(__name__)

MAX_QUEUED_FRAMES = 4


class MicrophoneUnavailable(ValueError):
    """No usable microphone; the message (one line) says what to install or which devices exist."""


def import_sounddevice(import_module=importlib.import_module):
    try:
        return import_module("sounddevice")
    except OSError as exc:  # sounddevice's own check: libportaudio is not on the system
        raise MicrophoneUnavailable(
            "microphone unavailable: PortAudio library not found; install it with "
            "`apt-get install libportaudio2` (Debian/Ubuntu) or `brew install portaudio` (macOS)"
        ) from exc
    except ImportError as exc:
        raise MicrophoneUnavailable(
            "microphone unavailable: the sounddevice package is not installed; install it with "
            "`pip install sounddevice`") from exc


def probe_input(device: str | None, sample_rate_hz: int, sd=None) -> int:
    """The PortAudio index of the input device to record from (`device`: index, name or None
    for the default), checked to record mono float32 at `sample_rate_hz`."""
    sd = sd if sd is not None else import_sounddevice()
    devices = list(sd.query_devices())
    inputs = [(i, d) for i, d in enumerate(devices) if d["max_input_channels"] > 0]
    if not inputs:
        seen = "; ".join(_describe(i, d) for i, d in enumerate(devices)) or "no audio device"
        raise MicrophoneUnavailable(
            f"microphone unavailable: no input device (PortAudio sees: {seen}); connect a "
            "microphone, or give this user access to the sound devices (group `audio`)")
    listing = "; ".join(_describe(i, d) for i, d in inputs)
    wanted = int(device) if device is not None and device.isdigit() else device
    try:
        info = sd.query_devices(wanted, kind="input")
    except (ValueError, sd.PortAudioError) as exc:
        what = "no default input device" if device is None else f"input device {device!r} not found"
        raise MicrophoneUnavailable(
            f"microphone unavailable: {what} ({_one_line(exc)}); input devices: {listing}; "
            "choose one with --mic-device") from None
    index = int(info["index"])
    try:
        sd.check_input_settings(device=index, channels=1, dtype="float32",
                                samplerate=sample_rate_hz)
    except (ValueError, sd.PortAudioError) as exc:
        raise MicrophoneUnavailable(
            f"microphone unavailable: input device {_describe(index, info)} cannot record mono "
            f"at {sample_rate_hz} Hz ({_one_line(exc)}); input devices: {listing}") from None
    return index


@lru_cache(maxsize=8)
def system_input(device: str | None, sample_rate_hz: int) -> int:
    """probe_input with the real sounddevice, once per setting, in a child process: settings
    are validated on every RunConfig, and importing sounddevice here would leave its cffi module
    in sys.modules, where vLLM's kernel rebinding (it walks every module's attributes at worker
    start) trips over PortAudio's macOS-only symbols and fails the engine. Failures are not
    cached (an exception is never stored)."""
    code = ("import json, sys\n"
            "from load_gen.mic import MicrophoneUnavailable, probe_input\n"
            "try:\n"
            "    print(json.dumps({'index': probe_input(sys.argv[1] or None, int(sys.argv[2]))}))\n"
            "except MicrophoneUnavailable as exc:\n"
            "    print(json.dumps({'error': str(exc)}))\n")
    root = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run([sys.executable, "-c", code, device or "", str(sample_rate_hz)],
                            capture_output=True, text=True, timeout=60, cwd=root)
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise MicrophoneUnavailable(
            f"microphone unavailable: the device probe failed ({_one_line(Exception(result.stderr))})"
        ) from None
    if "error" in answer:
        raise MicrophoneUnavailable(answer["error"])
    return int(answer["index"])


def _describe(index: int, info) -> str:
    return (f"{index} {info['name']!r} ({info['max_input_channels']} in, "
            f"{info['max_output_channels']} out)")


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class MicFrames:
    """The live session's frames (a FrameSource). Opens and starts the stream at construction."""

    end_reason: str | None = None  # FrameSource: it ends when its frames do ("source ended")

    def __init__(self, tokenizer: FrameTokenizer, device: int | None = None, sd=None) -> None:
        sd = sd if sd is not None else import_sounddevice()
        self._tokenizer = tokenizer
        self._blocks: deque = deque(maxlen=MAX_QUEUED_FRAMES)
        self._expected = 0  # index of the next block we have not consumed or dropped
        self.underruns = 0
        self.dropped = 0
        blocks, counter = self._blocks, itertools.count()

        # A closure, not a method: the stream must not keep this object alive, so that dropping
        # the source (the runtime closing the session) closes the device through the finalizer.
        def on_block(indata, frames, time, status):  # noqa: ARG001 - PortAudio's signature
            blocks.append((next(counter), indata[:, 0].copy()))

        try:
            stream = sd.InputStream(samplerate=tokenizer.sample_rate_hz,
                                    blocksize=tokenizer.frame_samples, device=device, channels=1,
                                    dtype="float32", callback=on_block)
        except (ValueError, sd.PortAudioError) as exc:
            raise MicrophoneUnavailable(
                f"microphone unavailable: cannot open input device {device}: {_one_line(exc)}"
            ) from None
        self._stream = stream
        self._closer = weakref.finalize(self, stream.close)
        try:
            stream.start()
        except sd.PortAudioError as exc:
            self._closer()
            raise MicrophoneUnavailable(
                f"microphone unavailable: cannot start input device {device}: {_one_line(exc)}"
            ) from None
        logger.info("microphone open: device %s, %d Hz, blocks of %d samples", device,
                    tokenizer.sample_rate_hz, tokenizer.frame_samples)

    def next_frame(self, frame_s: float) -> Frame | None:
        self._tokenizer.check_period(frame_s)
        if not self._closer.alive or not self._stream.active:
            return None  # closed, or PortAudio stopped the stream (device gone)
        if not self._blocks:
            self.underruns += 1
            audio = np.zeros(self._tokenizer.frame_samples, np.float32)
            return Frame(self._tokenizer.tokenize(audio).tolist(), self._expected * frame_s,
                         False, audio)
        index, audio = self._blocks.popleft()
        if index > self._expected:
            self.dropped += index - self._expected
            logger.warning("microphone: %d frame(s) dropped (the metronome fell behind)",
                           index - self._expected)
        self._expected = index + 1
        return Frame(self._tokenizer.tokenize(audio).tolist(), index * frame_s,
                     voice_active(audio), audio)

    def close(self) -> None:
        self._closer()
