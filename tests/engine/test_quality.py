"""Streaming perplexity (engine/quality.py): the masks keep exactly the keys of each policy, the
masked pass reproduces the model's own causal pass, and on SmolLM2 sinks recover most of what the
window alone loses. The `metronome quality` CLI prints one JSON object or one error line."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from cli.main import EXIT_USAGE
from engine.models import build_tiny
from engine.quality import (
    QualitySettings,
    default_text_path,
    kept_keys,
    load_model,
    load_token_ids,
    measure,
    read_text,
    streaming_perplexity,
)

N_TOKENS = 200
FIRST_SCORED = 68  # W + S of a 64-token window with 4 sinks


def _rows(*rows: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows])


# Hand-checked, T = 8, W = 3, S = 1; block cases with blocks of 2 tokens.
@pytest.mark.parametrize("sinks, granularity, expected", [
    (1, "token", _rows("10000000",
                       "11000000",
                       "11100000",
                       "11110000",
                       "10111000",   # t=4: sink 0, window 2..4
                       "10011100",
                       "10001110",
                       "10000111")),
    (0, "token", _rows("10000000",
                       "11000000",
                       "11100000",
                       "01110000",
                       "00111000",
                       "00011100",
                       "00001110",
                       "00000111")),
    (1, "block", _rows("10000000",
                       "11000000",
                       "11100000",
                       "11110000",
                       "11111000",   # sink block [0, 2) plus the window's block 2 onward
                       "11111100",   # oldest window token 3 sits in block [2, 4)
                       "11001110",   # oldest 4: block [4, 6); keys 2, 3 are the gap
                       "11001111")),
    (0, "block", _rows("10000000",
                       "11000000",
                       "11100000",
                       "11110000",   # oldest window token 1 sits in block [0, 2)
                       "00111000",
                       "00111100",   # one extra old key (2) from the window's first block
                       "00001110",
                       "00001111")),
])
def test_kept_keys_are_exactly_the_policy(sinks, granularity, expected):
    assert torch.equal(kept_keys(8, 3, sinks, granularity, block_size=2), expected)


def test_full_attention_keeps_every_earlier_key():
    assert torch.equal(kept_keys(5), torch.ones(5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("window", [64, 70])
def test_a_block_window_keeps_from_window_to_window_plus_block_minus_one_keys(window):
    kept = kept_keys(300, window, 0, "block", block_size=32).sum(dim=1)
    after_fill = kept[window - 1:]
    assert after_fill.min() == window and after_fill.max() == window + 31


@pytest.fixture(scope="module")
def tiny():
    # float32 on every machine: the masked and the plain pass agree to 1e-4 only where rounding
    # does not differ between SDPA's two code paths (bf16 on an AVX-512 BF16 CPU: ~3 %).
    tokenizer, model = load_model(build_tiny(), dtype="float32")
    token_ids = load_token_ids(tokenizer, default_text_path(), N_TOKENS)
    return model, token_ids


def test_full_mask_reproduces_the_models_own_causal_pass(tiny):
    model, ids = tiny
    masked = streaming_perplexity(model, ids, kept_keys(N_TOKENS), FIRST_SCORED)
    with torch.inference_mode():
        logits = model(ids[None]).logits[0]
    plain = math.exp(F.cross_entropy(logits[FIRST_SCORED:-1], ids[FIRST_SCORED + 1:]).item())
    assert masked == pytest.approx(plain, rel=1e-4)


@pytest.mark.parametrize("granularity", ["token", "block"])
@pytest.mark.parametrize("window", [N_TOKENS, N_TOKENS + 50])
def test_a_window_as_long_as_the_text_is_full_attention(granularity, window):
    assert torch.equal(kept_keys(N_TOKENS, window, 0, granularity), kept_keys(N_TOKENS))


def test_a_short_window_changes_the_perplexity(tiny):
    """Guards against a mask that the model silently ignores."""
    model, ids = tiny
    full = streaming_perplexity(model, ids, kept_keys(N_TOKENS), FIRST_SCORED)
    window = streaming_perplexity(model, ids, kept_keys(N_TOKENS, 16), FIRST_SCORED)
    assert abs(window - full) > 1e-3 * full


def test_fortune_folders_read_in_name_order_without_separators(tmp_path):
    (tmp_path / "b").write_text("Second.\n%\nThird.\n")
    (tmp_path / "a").write_text("First, *___\b\b\band* underlined.")  # no final newline
    (tmp_path / "a.dat").write_bytes(b"\x00\x02index")
    (tmp_path / "a.u8").symlink_to(tmp_path / "a")
    text, complete = read_text(tmp_path)
    assert complete
    assert text == "First, *and* underlined.\nSecond.\n\nThird.\n"
    assert read_text(tmp_path, max_chars=5) == ("First, *and* underlined.", False)


def test_text_shorter_than_the_tokens_asked_is_refused(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(build_tiny())
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.\n")
    with pytest.raises(ValueError, match=r"tokens 1000 exceed the \d+ tokens of text"):
        load_token_ids(tokenizer, short, 1000)


@pytest.mark.parametrize("change, needle", [
    ({"window_tokens": 0}, "window 0 must be ≥ 1 token"),
    ({"sink_tokens": -1}, "sinks -1 must be ≥ 0 tokens"),
    ({"n_tokens": 260}, "tokens 260 must be ≥ window + sinks + 2 = 262"),
    ({"block_size": 0}, "block size 0 must be ≥ 1 token"),
    ({"granularity": "page"}, "granularity 'page' is not one of token, block"),
    ({"model": "nope"}, "model 'nope' is not one of tiny, smollm2"),
    ({"text_path": "/nonexistent/text"}, "text /nonexistent/text does not exist"),
])
def test_settings_name_the_bad_value(change, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        QualitySettings(**change)


def _metronome_quality(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "quality", "--json", "--model", "tiny",
                           *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "METRONOME_LOG": "INFO"})


@pytest.mark.parametrize("args, needle", [
    (["--window", "0"], "window 0 must be ≥ 1 token"),
    (["--window", "64", "--sinks", "4", "--tokens", "60"],
     "tokens 60 must be ≥ window + sinks + 2 = 70"),
    (["--text", "/nonexistent/text"], "text /nonexistent/text does not exist"),
])
def test_cli_rejects_bad_input_in_one_line(args, needle):
    r = _metronome_quality(*args)
    assert r.returncode == EXIT_USAGE and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("metronome: error: "), r.stderr
    assert needle in lines[0]


def test_cli_prints_one_json_object_with_the_settings():
    r = _metronome_quality("--window", "64", "--sinks", "4", "--tokens", str(N_TOKENS))
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert {"model": "tiny", "window": 64, "sinks": 4, "tokens": N_TOKENS, "block_size": 32,
            "granularity": "block"}.items() <= result.items()
    assert result["text_source"] == str(default_text_path())
    assert result["scored_positions"] == N_TOKENS - 1 - FIRST_SCORED
    assert all(math.isfinite(result[k]) and result[k] > 1 for k in
               ("ppl_full", "ppl_window", "ppl_sinks"))
    assert "quality 3/3: sinks+window perplexity" in r.stderr  # progress goes to stderr


@pytest.mark.slow
def test_sinks_recover_most_of_the_window_loss_on_smollm2():
    result = measure(QualitySettings(model="smollm2", window_tokens=256, sink_tokens=4,
                                     n_tokens=1536))
    full, window, sinks = result["ppl_full"], result["ppl_window"], result["ppl_sinks"]
    assert full < window, result
    assert sinks < window and sinks - full < 0.5 * (window - full), result
