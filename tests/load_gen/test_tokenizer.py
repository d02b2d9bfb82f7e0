"""The audio frame tokenizer: the codec's rate, deterministic ids inside the vocabulary."""

import numpy as np
import pytest

from load_gen.tokenizer import FrameTokenizer, frame_tokenizer
from load_gen.wav import load_folder


@pytest.fixture(scope="module")
def frames_16k(speech):
    """80 ms frames (1280 samples at 16 kHz) of the fox sentence and of its padded silence."""
    clip = next(c for c in load_folder(str(speech["dir"]), 16000) if c.name == "a_fox.wav")
    n = 1280
    frames = [clip.samples[i:i + n] for i in range(0, len(clip.samples) - n + 1, n)]
    pad_frames = int(1.0 * 16000 // n)  # wholly inside the leading second of silence
    spoken = range(pad_frames + 1, pad_frames + int(speech["speech_s"]["a_fox.wav"] * 16000 // n))
    return {"silence": frames[:pad_frames], "speech": [frames[i] for i in spoken]}


def test_same_audio_gives_the_same_ids_in_every_tokenizer(frames_16k):
    a = FrameTokenizer(16000, 80.0, 16, 2048)
    b = FrameTokenizer(16000, 80.0, 16, 2048)
    first = [a.tokenize(f) for f in frames_16k["speech"]]
    assert all(np.array_equal(x, b.tokenize(f)) for x, f in zip(first, frames_16k["speech"]))
    assert all(np.array_equal(x, a.tokenize(f)) for x, f in zip(first, frames_16k["speech"]))
    assert frame_tokenizer(16000, 80.0, 16, 2048) is frame_tokenizer(16000, 80.0, 16, 2048)


@pytest.mark.parametrize("vocab_size, codebook_size", [
    (2, 1), (100, 64), (2048, 1024), (49152, 2048), (151_936, 2048)])
def test_ids_stay_in_the_top_of_the_vocabulary(frames_16k, vocab_size, codebook_size):
    tok = FrameTokenizer(16000, 80.0, 16, vocab_size)
    assert tok.codebook_size == codebook_size
    ids = np.stack([tok.tokenize(f) for f in frames_16k["speech"] + frames_16k["silence"]])
    assert ids.shape[1] == 16 and ids.dtype == np.int64
    assert ids.min() >= vocab_size - codebook_size >= 1 and ids.max() < vocab_size


def test_speech_spreads_over_the_codebook_and_silence_is_one_id(frames_16k):
    tok = FrameTokenizer(16000, 80.0, 16, 2048)
    speech_ids = np.concatenate([tok.tokenize(f) for f in frames_16k["speech"]])
    silence_ids = np.concatenate([tok.tokenize(f) for f in frames_16k["silence"]])
    assert len(np.unique(speech_ids)) >= 40
    zeros = tok.tokenize(np.zeros(1280, np.float32))
    assert set(silence_ids) == set(zeros) and len(set(zeros)) == 1


@pytest.mark.parametrize("rate_hz, frame_ms, tokens_in, frame_samples", [
    (16000, 80.0, 8, 1280), (24000, 80.0, 8, 1920), (16000, 1000.0, 25, 16000),
    (16000, 10.0, 32, 160)])
def test_one_frame_of_audio_gives_tokens_in_ids(rate_hz, frame_ms, tokens_in, frame_samples):
    tok = FrameTokenizer(rate_hz, frame_ms, tokens_in, 2048)
    assert tok.frame_samples == frame_samples
    noise = np.random.default_rng(0).normal(0, 0.1, frame_samples).astype(np.float32)
    assert tok.tokenize(noise).shape == (tokens_in,)
    with pytest.raises(ValueError, match=f"is not \\({frame_samples},\\) samples"):
        tok.tokenize(noise[:-1])


@pytest.mark.parametrize("args, needle", [
    ((500, 80.0, 16, 2048), "sample rate 500 Hz"), ((16000, 0.01, 16, 2048), "holds no sample"),
    ((16000, 80.0, 0, 2048), "tokens in 0"), ((16000, 80.0, 16, 1), "vocab size 1")])
def test_bad_settings_are_named(args, needle):
    with pytest.raises(ValueError, match=needle):
        FrameTokenizer(*args)
