"""The bundled realtime speech model (engine/realtime_model.py): built from a seed, the same
bytes every time, quickly, in the format vLLM's Qwen3-ASR realtime class reads."""

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.realtime_model import FILES, SPECIAL_TOKENS, AsrTinyShape, build_asr_tiny

BUILD_BUDGET_S = 60.0  # ~7 s on a shared 2-core machine; the tokenizer's training dominates


def _digests(folder) -> dict:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


def test_builds_the_same_files_twice_and_fast(tmp_path):
    start = time.perf_counter()
    first = build_asr_tiny(0, tmp_path / "a")
    took = time.perf_counter() - start
    # The second in another process: nothing may hang on a process's hash seed or state.
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from engine.realtime_model import build_asr_tiny; "
                    "build_asr_tiny(0, Path(sys.argv[1]))", str(tmp_path / "b")],
                   cwd=root, check=True, timeout=300)
    second = tmp_path / "b"
    assert _digests(first) == _digests(second)
    assert took < BUILD_BUDGET_S, f"one build took {took:.1f} s"
    # Cached: a second call on a built folder builds nothing.
    start = time.perf_counter()
    assert build_asr_tiny(0, first) == first and time.perf_counter() - start < 1.0


def test_another_seed_gives_other_weights(tmp_path):
    a, b = build_asr_tiny(0, tmp_path / "a"), build_asr_tiny(1, tmp_path / "b")
    assert _digests(a)["model.safetensors"] != _digests(b)["model.safetensors"]


def test_config_tokens_and_weights_fit_what_vllm_reads(tmp_path):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    folder = build_asr_tiny(0, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ASRRealtimeGeneration"]
    thinker = config["thinker_config"]
    text = thinker["text_config"]
    # M-RoPE's three sections cover the head's rotary pairs.
    assert sum(text["rope_scaling"]["mrope_section"]) == text["head_dim"] // 2
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    assert ids == list(range(len(SPECIAL_TOKENS)))  # each special token is one id
    assert thinker["audio_token_id"] == tok.convert_tokens_to_ids(tok.audio_token)
    assert len(tok) == text["vocab_size"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        head = f.get_tensor("thinker.lm_head.weight")
    assert "lm_head.weight" not in names  # vLLM maps only the thinker's head
    assert tuple(head.shape) == (text["vocab_size"], text["hidden_size"])
    assert any(n.startswith("model.audio_tower.") for n in names)
    assert any(n.startswith("model.multi_modal_projector.") for n in names)


@pytest.mark.parametrize("field, value, words", [
    ("text_head_dim", 30, "multiple of 4"), ("text_kv_heads", 3, "multiple of text_kv_heads"),
    ("audio_layers", 0, "[1, 65536]")])
def test_shape_refuses_what_would_not_build(field, value, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        AsrTinyShape(**{field: value})
