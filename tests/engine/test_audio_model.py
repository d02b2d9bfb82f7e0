"""The bundled audio-in model: built locally from a seed, byte-identical twice, in seconds, with
weight names vLLM's Qwen2-Audio loader places (the transformers 5.x save_pretrained trap)."""

import hashlib
import json
import time

import pytest
from safetensors import safe_open

from engine.audio_model import (AUDIO_TOKENS, WEIGHTS, build_audio_tiny, checkpoint_names)
from engine.models import NAMED_MODELS, model_info


def _hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("audio-tiny")
    started = time.perf_counter()
    first = build_audio_tiny(0, root / "a")
    seconds = time.perf_counter() - started
    return first, build_audio_tiny(0, root / "b"), seconds


def test_the_model_builds_identically_twice_in_seconds(two_builds):
    first, second, seconds = two_builds
    hashes = _hashes(first)
    assert {"config.json", WEIGHTS, "tokenizer.json", "processor_config.json"} <= set(hashes)
    assert hashes == _hashes(second)
    assert seconds < 30, f"built in {seconds:.1f} s"


def test_a_different_seed_gives_different_weights(two_builds, tmp_path):
    other = build_audio_tiny(1, tmp_path / "seed1")
    assert _hashes(other)[WEIGHTS] != _hashes(two_builds[0])[WEIGHTS]


def test_weights_carry_the_names_vllm_loads(two_builds):
    with safe_open(str(two_builds[0] / WEIGHTS), "pt") as f:
        names = list(f.keys())
    assert not [n for n in names if n.startswith("language_model.model.model.")]
    assert "language_model.model.embed_tokens.weight" in names
    assert "language_model.lm_head.weight" in names
    assert "audio_tower.embed_positions.weight" in names
    assert all(n.split(".")[0] in ("audio_tower", "multi_modal_projector", "language_model")
               for n in names)


def test_checkpoint_names_undo_the_save_pretrained_trap():
    # What transformers 5.x keeps in memory and what its save_pretrained writes both land on
    # the names vLLM's Qwen2AudioForConditionalGeneration loads.
    assert checkpoint_names(["model.language_model.layers.0.mlp.up_proj.weight",
                             "lm_head.weight", "model.audio_tower.conv1.weight",
                             "language_model.model.model.norm.weight"]) == {
        "model.language_model.layers.0.mlp.up_proj.weight":
            "language_model.model.layers.0.mlp.up_proj.weight",
        "lm_head.weight": "language_model.lm_head.weight",
        "model.audio_tower.conv1.weight": "audio_tower.conv1.weight",
        "language_model.model.model.norm.weight": "language_model.model.norm.weight"}
    with pytest.raises(ValueError, match="vision_tower.x.*no checkpoint name"):
        checkpoint_names(["vision_tower.x"])


def test_tokenizer_processor_and_config_fit_the_architecture(two_builds):
    from transformers import AutoProcessor

    folder = two_builds[0]
    processor = AutoProcessor.from_pretrained(folder)
    ids = processor.tokenizer.convert_tokens_to_ids(list(AUDIO_TOKENS))
    assert len(set(ids)) == 3 and processor.audio_token_id == ids[1]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2AudioForConditionalGeneration"]
    assert config["audio_token_index"] == ids[1]
    assert config["text_config"]["hidden_size"] == 128
    assert config["text_config"]["num_hidden_layers"] == 2
    assert config["audio_config"]["encoder_layers"] == 2
    assert model_info(folder)["num_layers"] == 2  # the LM's facts, read from text_config
    chat = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}],
        add_generation_prompt=True, tokenize=False)
    assert chat == ("<|im_start|>user\n<|audio_bos|><|AUDIO|><|audio_eos|>hi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_audio_tiny_is_a_named_model():
    assert "audio-tiny" in NAMED_MODELS
