"""The audio path without an engine: what a frame becomes (engine/audio_input.py), the frame
check, the plugin's activation and refusals (engine/audio_plugin.py), the synthetic load's
audio and what each load says it feeds."""

import numpy as np
import pytest

from engine.audio_input import (audio_input, entry_point_refusal, is_audio_model,
                                undriven_refusal)
from engine.audio_model import build_audio_tiny
from engine.audio_plugin import config_entry, mel_frames_in, version_refusal
from engine.contract import check_frame
from engine.models import build_tiny
from load_gen import input_feed
from load_gen.generated import SyntheticFrames


@pytest.fixture(scope="module")
def model():
    return build_audio_tiny(0)


def test_a_frame_is_what_the_models_processor_makes_of_it(model):
    info = audio_input(model, 80.0)
    # 80 ms at 16 kHz: 1280 samples, 8 mel frames (10 ms hop), 2 encoder positions.
    assert (info.frame_samples, info.mel_frames, info.audio_tokens) == (1280, 8, 2)
    assert info.frame_ids == (info.chunk_ids[0], info.audio_token_id, info.audio_token_id,
                              info.chunk_ids[2])
    assert audio_input(model, 160.0).audio_tokens == 4  # the processor's count, not chosen
    args = info.engine_args()
    assert args["hf_overrides"] == {"audio_config": {"max_source_positions": 4}}
    assert args["mm_processor_kwargs"] == {"max_length": 1280}
    chunk = info.chunk([np.zeros(1280, np.float32)] * 2, ["a", "b"])
    assert chunk["prompt_token_ids"] == list(info.chunk_ids) * 2
    assert chunk["multi_modal_uuids"] == {"audio": ["a", "b"]}
    with pytest.raises(ValueError, match=r"\(1000,\) is not \(1280,\)"):
        info.chunk([np.zeros(1000, np.float32)], ["c"])


def test_frame_periods_the_encoder_cannot_halve_are_refused(model):
    with pytest.raises(ValueError, match="multiples of 20 ms"):
        audio_input(model, 90.0)


def test_only_audio_architectures_take_the_audio_path(model, tmp_path):
    assert is_audio_model(model) and not is_audio_model(build_tiny(0))
    assert undriven_refusal(model) is None
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2_5OmniModel"]}')
    line = undriven_refusal(tmp_path)
    assert "audio-in Qwen2_5OmniModel" in line and "\n" not in line


def test_the_frame_check_takes_whole_audio_frames():
    frame = (3, 4, 4, 5)
    check_frame(list(frame) * 2, 1, 100, [np.zeros(8)] * 2, frame)
    with pytest.raises(ValueError, match="once per frame; got 4 ids and no audio"):
        check_frame(list(frame), 1, 100, None, frame)
    with pytest.raises(ValueError, match="got 8 ids and 1 audio"):
        check_frame(list(frame) * 2, 1, 100, [np.zeros(8)], frame)
    with pytest.raises(ValueError, match="takes token ids, not audio"):
        check_frame([1, 2], 1, 100, [np.zeros(8)])


def test_the_plugin_is_inert_unless_asked_and_checks_what_it_is_asked():
    from types import SimpleNamespace

    def config(extra):
        return SimpleNamespace(additional_config=extra)

    assert mel_frames_in(config({})) is None
    assert mel_frames_in(config({"metronome_sinks": {}})) is None
    assert mel_frames_in(config(config_entry(8))) == 8
    with pytest.raises(ValueError, match="'mel_frames': 7}: mel_frames must be an even"):
        mel_frames_in(config(config_entry(7)))


def test_another_vllm_is_refused_in_one_line():
    assert version_refusal("0.32.0+cpu") is None
    line = version_refusal("0.33.1")
    assert "not vLLM 0.33.1" in line and "vllm==0.32.0" in line and "\n" not in line


def test_the_audio_plugin_entry_point_is_installed():
    # pyproject.toml declares it; an install without it would keep the 30 s window.
    assert entry_point_refusal() is None


def test_a_synthetic_load_on_an_audio_model_feeds_seeded_noise_and_says_so():
    a = SyntheticFrames(7, 100, 4, audio_samples=1280).next_frame(0.08)
    b = SyntheticFrames(7, 100, 4, audio_samples=1280).next_frame(0.08)
    assert a.audio.dtype == np.float32 and a.audio.shape == (1280,)
    assert np.array_equal(a.audio, b.audio)
    rms_db = 20 * np.log10(np.sqrt(np.mean(a.audio ** 2)))
    assert abs(rms_db + 30) < 1
    assert SyntheticFrames(7, 100, 4).next_frame(0.08).audio is None
    assert "white noise" in input_feed("fixed", True) and "encoder" in input_feed("fixed", True)
    assert input_feed("wav", True) == "wav audio through the model's audio encoder"
    assert "stand-in token ids" in input_feed("wav", False)
    assert input_feed("fixed", False) == "seeded random token ids"



def test_the_frame_log_mel_is_the_whisper_extractors_own(model, monkeypatch):
    """The frame path (engine/audio_features.py) gives what the model's extractor gives, through
    the model's processor as vLLM calls it; a call it does not cover goes to the original."""
    from transformers import AutoProcessor, WhisperFeatureExtractor

    from engine import audio_features

    original = getattr(WhisperFeatureExtractor.__call__, "__wrapped__",
                       WhisperFeatureExtractor.__call__)
    audio_features.install()
    taken = []
    real = audio_features.frame_log_mel
    monkeypatch.setattr(audio_features, "frame_log_mel",
                        lambda frames, *a: taken.append(len(frames)) or real(frames, *a))
    processor = AutoProcessor.from_pretrained(str(model))
    fe = processor.feature_extractor
    rng = np.random.default_rng(3)
    t = np.arange(1280) / 16_000
    frames = [(rng.standard_normal(1280) * 0.1).astype(np.float32),
              (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32),
              np.zeros(1280, np.float32), (rng.standard_normal(1280) * 1e-4).astype(np.float64)]
    kwargs = {"sampling_rate": 16_000, "padding": "max_length", "max_length": 1280,
              "return_attention_mask": True}
    for tensors in (None, "pt"):
        ours, ref = fe(frames, return_tensors=tensors, **kwargs), \
            original(fe, frames, return_tensors=tensors, **kwargs)
        assert sorted(ours) == sorted(ref)
        for key in ref:
            a, b = np.asarray(ours[key]), np.asarray(ref[key])
            assert (a.shape, a.dtype) == (b.shape, b.dtype), key
            np.testing.assert_allclose(a, b, atol=2e-5, err_msg=key)
    assert taken == [4, 4]
    text = "<|audio_bos|><|AUDIO|><|audio_eos|>" * 2
    out = processor(text=text, audio=frames[:2], sampling_rate=16_000, max_length=1280,
                    return_tensors="pt")
    assert taken[-1] == 2  # the processor's call took the frame path
    np.testing.assert_allclose(out["input_features"].numpy(),
                               original(fe, frames[:2], **kwargs)["input_features"], atol=2e-5)
    stock = fe(frames[0], sampling_rate=16_000, return_attention_mask=True)  # 30 s padding
    assert stock["input_features"].shape == (1, 128, 3000) and len(taken) == 3
