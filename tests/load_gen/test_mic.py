"""The microphone at the `sounddevice` boundary: a fake stream feeds the real callback; no
PortAudio and no input device give one plain line."""

import gc
import subprocess
import sys

import numpy as np
import pytest

from load_gen import LoadConfig
from load_gen.mic import (MAX_QUEUED_FRAMES, MicFrames, MicrophoneUnavailable,
                          import_sounddevice, probe_input, system_input)
from load_gen.tokenizer import FrameTokenizer
from load_gen.wav import WavFrames, load_folder


class FakeSoundDevice:
    """Stands in for the `sounddevice` module: devices, settings check, an input stream whose
    callback the test calls the way PortAudio's thread would."""

    class PortAudioError(Exception):
        pass

    def __init__(self, devices, default_input=None, rates_hz=(16000, 44100, 48000),
                 busy=False):
        self.devices = [dict(d, index=i) for i, d in enumerate(devices)]
        self.default_input = default_input
        self.rates_hz = rates_hz
        self.busy = busy  # another program holds the device: starting the stream fails
        self.streams = []

    def query_devices(self, device=None, kind=None):
        if device is None and kind is None:
            return list(self.devices)
        if device is None:
            if self.default_input is None:
                raise self.PortAudioError("Error querying device -1")
            device = self.default_input
        matches = [d for d in self.devices if d["index"] == device
                   or isinstance(device, str) and device.lower() in d["name"].lower()]
        if not matches or matches[0]["max_input_channels"] < 1:
            raise ValueError(f"No input device matching {device!r}")
        return matches[0]

    def check_input_settings(self, device, channels, dtype, samplerate):
        if samplerate not in self.rates_hz:
            raise self.PortAudioError("Invalid sample rate [PaErrorCode -9997]")

    def InputStream(self, **kwargs):  # noqa: N802 - sounddevice's name
        stream = FakeStream(self, **kwargs)
        self.streams.append(stream)
        return stream


class FakeStream:
    def __init__(self, sd, samplerate, blocksize, device, channels, dtype, callback):
        self.sd = sd
        self.settings = dict(samplerate=samplerate, blocksize=blocksize, device=device,
                             channels=channels, dtype=dtype)
        self.callback = callback
        self.active = False
        self.closed = False

    def start(self):
        if self.sd.busy:
            raise self.sd.PortAudioError("Device unavailable [PaErrorCode -9985]")
        self.active = True

    def close(self):
        self.active, self.closed = False, True

    def deliver(self, block):
        """What PortAudio does once per block: call back with a (frames, channels) buffer it
        reuses for the next block."""
        buffer = np.array(block, np.float32).reshape(-1, 1)
        self.callback(buffer, len(buffer), None, None)
        buffer[:] = 0.0  # the driver overwrites its buffer: the callback must have copied


LAPTOP = [{"name": "HDMI 0", "max_input_channels": 0, "max_output_channels": 8},
          {"name": "Built-in Microphone", "max_input_channels": 2, "max_output_channels": 0}]


@pytest.fixture
def tok():
    return FrameTokenizer(16000, 80.0, 16, 2048)


@pytest.fixture
def fox_frames(speech, tok):
    clip = next(c for c in load_folder(str(speech["dir"]), 16000) if c.name == "a_fox.wav")
    source, frames = WavFrames(clip, tok, loop=False), []
    while (frame := source.next_frame(0.08)) is not None:
        frames.append(frame)
    return frames


def test_the_stream_has_a_block_of_one_frame_and_frames_match_wav_replay(tok, fox_frames):
    sd = FakeSoundDevice(LAPTOP, default_input=1)
    mic = MicFrames(tok, probe_input(None, 16000, sd=sd), sd=sd)
    (stream,) = sd.streams
    assert stream.settings == dict(samplerate=16000, blocksize=1280, device=1, channels=1,
                                   dtype="float32")
    assert stream.active
    frames = []
    for replayed in fox_frames:  # the speaker says the fox sentence into the microphone
        stream.deliver(replayed.audio)
        frames.append(mic.next_frame(0.08))
    assert [f.token_ids for f in frames] == [f.token_ids for f in fox_frames]
    assert [f.voice_active for f in frames] == [f.voice_active for f in fox_frames]
    assert any(f.voice_active for f in frames) and not all(f.voice_active for f in frames)
    assert [f.t_media_s for f in frames] == pytest.approx([f.t_media_s for f in fox_frames])
    assert mic.underruns == mic.dropped == 0


def test_the_metronome_paces_the_microphone(tok, fox_frames):
    sd = FakeSoundDevice(LAPTOP, default_input=1)
    mic = MicFrames(tok, 1, sd=sd)
    stream = sd.streams[0]
    first = mic.next_frame(0.08)  # the first period is still being recorded
    assert first is not None and not first.voice_active and mic.underruns == 1
    assert len(first.token_ids) == 16 and not first.audio.any()
    speech = [f for f in fox_frames if f.voice_active]
    for f in speech[:MAX_QUEUED_FRAMES + 2]:  # the loop stalled for six periods
        stream.deliver(f.audio)
    frame = mic.next_frame(0.08)
    assert mic.dropped == 2 and frame.t_media_s == pytest.approx(2 * 0.08)  # oldest dropped
    assert frame.token_ids == speech[2].token_ids


def test_closing_or_losing_the_device_ends_the_session(tok):
    sd = FakeSoundDevice(LAPTOP, default_input=1)
    mic = MicFrames(tok, 1, sd=sd)
    sd.streams[0].active = False  # PortAudio stopped the stream: device unplugged
    assert mic.next_frame(0.08) is None
    mic.close()
    mic.close()
    assert sd.streams[0].closed
    dropped = MicFrames(tok, 1, sd=sd)
    del dropped  # the runtime drops a closed session's source: the device is released
    gc.collect()
    assert sd.streams[1].closed


def test_a_busy_device_is_said_plainly_and_released(tok):
    sd = FakeSoundDevice(LAPTOP, default_input=1, busy=True)
    with pytest.raises(MicrophoneUnavailable, match="cannot start input device 1: Device "
                                                    "unavailable"):
        MicFrames(tok, 1, sd=sd)
    assert sd.streams[0].closed


def test_no_portaudio_says_what_to_install():
    def without_portaudio(name):
        raise OSError("PortAudio library not found")  # what sounddevice raises at import

    with pytest.raises(MicrophoneUnavailable) as err:
        import_sounddevice(without_portaudio)
    assert str(err.value) == (
        "microphone unavailable: PortAudio library not found; install it with "
        "`apt-get install libportaudio2` (Debian/Ubuntu) or `brew install portaudio` (macOS)")

    def without_package(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    with pytest.raises(MicrophoneUnavailable, match="`pip install sounddevice`"):
        import_sounddevice(without_package)


@pytest.mark.parametrize("devices, default, device, needle", [
    (LAPTOP[:1], None, None,
     "no input device (PortAudio sees: 0 'HDMI 0' (0 in, 8 out)); connect a microphone"),
    ([], None, None, "no input device (PortAudio sees: no audio device)"),
    (LAPTOP, None, None, "no default input device (Error querying device -1); input devices: "
                         "1 'Built-in Microphone' (2 in, 0 out); choose one with --mic-device"),
    (LAPTOP, 1, "usb", "input device 'usb' not found"),
    (LAPTOP, 1, "0", "input device '0' not found"),
])
def test_no_usable_device_lists_the_devices(devices, default, device, needle):
    with pytest.raises(MicrophoneUnavailable) as err:
        probe_input(device, 16000, sd=FakeSoundDevice(devices, default))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_device_is_chosen_by_name_or_index_and_must_take_the_rate():
    sd = FakeSoundDevice(LAPTOP, default_input=None)
    assert probe_input("built-in", 16000, sd=sd) == 1
    assert probe_input("1", 16000, sd=sd) == 1
    with pytest.raises(MicrophoneUnavailable, match="cannot record mono at 24000 Hz"):
        probe_input("1", 24000, sd=sd)


def test_this_machine_without_a_microphone_is_told_so():
    """The real sounddevice, on a machine (like CI's) with no input device or no PortAudio."""
    try:
        system_input(None, 16000)
    except MicrophoneUnavailable as exc:
        message = str(exc)
    else:
        pytest.skip("this machine has a microphone")
    assert message.startswith("microphone unavailable: ") and "\n" not in message
    assert "libportaudio2" in message or "PortAudio sees:" in message
    with pytest.raises(MicrophoneUnavailable, match="microphone unavailable: "):
        LoadConfig("mic")  # refused before any engine starts


def test_other_loads_never_import_sounddevice():
    """Without PortAudio everything but the microphone keeps working: nothing else imports it."""
    code = ("import sys, load_gen, runtime; "
            "from runtime import RunConfig; RunConfig(engine='twin'); "
            "assert 'sounddevice' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
