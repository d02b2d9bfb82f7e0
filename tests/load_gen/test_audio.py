"""WAV decoding, resampling and the voice-activity gate on real files written by sox."""

import struct

import numpy as np
import pytest
from speechfiles import samples_of, sox

from load_gen.audio import level_dbfs, read_wav, resample, voice_active


@pytest.fixture(scope="module")
def fox(speech):
    return speech["dir"] / "a_fox.wav"


@pytest.mark.parametrize("sox_args, tolerance", [
    (["-b", "24"], 1e-4), (["-e", "floating-point", "-b", "32"], 1e-4),
    (["-b", "32"], 1e-4), (["-c", "2"], 1e-4), (["-b", "8"], 0.02),
])
def test_every_supported_encoding_decodes_to_the_same_samples(fox, tmp_path, sox_args, tolerance):
    reference, rate_hz = read_wav(fox)
    variant = tmp_path / "variant.wav"
    sox(fox, *sox_args, variant)  # 24-bit, float and stereo come out as WAVE_FORMAT_EXTENSIBLE
    samples, variant_rate_hz = read_wav(variant)
    assert variant_rate_hz == rate_hz == 22050 and samples.dtype == np.float32
    assert len(samples) == len(reference) == samples_of(fox)
    assert np.max(np.abs(samples - reference)) < tolerance
    assert 0.1 < np.max(np.abs(samples)) <= 1.0


def test_resampling_keeps_a_tone_at_its_frequency(tmp_path):
    tone = tmp_path / "tone.wav"
    sox("-n", "-r", 44100, "-b", 16, tone, "synth", 1.0, "sine", 1000, "vol", 0.5)
    samples, rate_hz = read_wav(tone)
    out = resample(samples, rate_hz, 16000)
    assert len(out) == round(len(samples) * 16000 / 44100) == 16000
    spectrum = np.abs(np.fft.rfft(out))
    assert np.fft.rfftfreq(len(out), 1 / 16000)[np.argmax(spectrum)] == pytest.approx(1000, abs=1)
    assert np.sqrt(np.mean(out ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)


@pytest.mark.parametrize("rate_hz", [8000, 48000])
def test_a_file_at_another_rate_resamples_to_the_same_speech(fox, tmp_path, rate_hz):
    """sox's resampler and ours agree on the speech band, whatever rate the file came at."""
    other = tmp_path / f"fox_{rate_hz}.wav"
    sox(fox, "-r", rate_hz, other)
    ours = resample(*read_wav(fox), 16000)
    theirs = resample(*read_wav(other), 16000)
    assert abs(len(ours) - len(theirs)) <= 1
    n = min(len(ours), len(theirs))
    band_hz = min(rate_hz, 16000) / 2  # what survived the trip through rate_hz
    assert np.corrcoef(_below(ours[:n], band_hz), _below(theirs[:n], band_hz))[0, 1] > 0.99


def _below(x, hz, rate_hz=16000):
    spectrum = np.fft.rfft(x)
    spectrum[np.fft.rfftfreq(len(x), 1 / rate_hz) > hz] = 0
    return np.fft.irfft(spectrum, len(x))


def test_voice_activity_is_speech_energy_not_offset(fox):
    samples, _ = read_wav(fox)
    assert not voice_active(np.zeros(1280, np.float32))
    assert not voice_active(np.full(1280, 0.3, np.float32))  # DC offset is not speech
    assert voice_active(samples[30000:31280])  # inside the spoken sentence
    assert level_dbfs(np.zeros(0, np.float32)) < -100


def _wav_bytes(fmt_code=1, bits=16, channels=1, rate_hz=16000, data=b"\x00\x01" * 100,
               with_data=True):
    fmt = struct.pack("<HHIIHH", fmt_code, channels, rate_hz, rate_hz * channels * bits // 8,
                      channels * bits // 8, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if with_data:
        body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("content, needle", [
    (b"this is text, not audio", "is not a RIFF/WAVE file"),
    (_wav_bytes()[:30], "truncated fmt chunk"),
    (_wav_bytes(fmt_code=2, bits=4), "has format 0x0002 with 4 bits"),
    (_wav_bytes(bits=12), "has format 0x0001 with 12 bits"),
    (_wav_bytes(with_data=False), "has no data chunk"),
    (_wav_bytes(data=b""), "has no audio samples"),
    (_wav_bytes(channels=0), "declares 0 channels"),
])
def test_a_corrupt_file_is_named_with_what_is_wrong(tmp_path, content, needle):
    path = tmp_path / "bad.wav"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=needle) as err:
        read_wav(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
