"""Streaming perplexity of a model under full, window-only and sinks+window KV.

The reference measurement behind `metronome quality` (DESIGN: "Windowed KV with sinks inside
vLLM"). Each policy is one forward pass over the whole text with absolute positions and an
explicit attention mask of exactly the keys the policy keeps, in fp32 on CPU with transformers,
so it needs neither vLLM nor a GPU. Only the positions after the window has filled are scored
("streaming perplexity after the window fills"): before that sinks+window still holds the whole
past and would dilute the comparison with positions where it equals full attention.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.models import NAMED_MODELS, resolve_model

logger = logging.getLogger(__name__)

GRANULARITIES = ("token", "block")
FORTUNES_DIR = Path("/usr/share/games/fortunes")  # Debian package `fortunes`
GPL3_FILE = Path("/usr/share/common-licenses/GPL-3")  # Debian `base-files`: always present
FORTUNE_SEPARATOR = "%"
# First guess of characters to read per wanted token (English BPE averages ~4); the reader
# grows it when the text turns out denser, so this only saves tokenizing megabytes of fortunes.
CHARS_PER_TOKEN_GUESS = 8


@dataclass(frozen=True)
class QualitySettings:
    """One quality measurement. Window, sinks, tokens and block size count tokens."""

    model: str = "smollm2"  # tiny, smollm2 or a local model folder
    window_tokens: int = 256
    sink_tokens: int = 4
    n_tokens: int = 4096
    block_size: int = 32  # tokens per KV block; used by granularity "block"
    granularity: str = "block"
    text_path: str | None = None  # None: fortunes when installed, else the GPL-3 text

    def __post_init__(self) -> None:
        if self.model not in NAMED_MODELS:
            resolve_model(self.model)  # a path: raises naming it unless it is a model folder
        if self.window_tokens < 1:
            raise ValueError(f"window {self.window_tokens} must be ≥ 1 token")
        if self.sink_tokens < 0:
            raise ValueError(f"sinks {self.sink_tokens} must be ≥ 0 tokens")
        least = self.first_scored_position + 2  # at least one scored prediction
        if self.n_tokens < least:
            raise ValueError(
                f"tokens {self.n_tokens} must be ≥ window + sinks + 2 = {least}: only "
                "positions after the window has filled are scored")
        if self.block_size < 1:
            raise ValueError(f"block size {self.block_size} must be ≥ 1 token")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity {self.granularity!r} is not one of "
                             f"{', '.join(GRANULARITIES)}")
        if self.text_path is not None and not Path(self.text_path).exists():
            raise ValueError(f"text {self.text_path} does not exist (a text file or a folder "
                             "of fortune files)")

    @property
    def first_scored_position(self) -> int:
        """Before query position W + S the sinks and the window together still cover the whole
        past (with block granularity a little longer), so sinks+window equals full attention
        there; from it on the three policies see different pasts."""
        return self.window_tokens + self.sink_tokens


def kept_keys(n_tokens: int, window_tokens: int | None = None, sink_tokens: int = 0,
              granularity: str = "token", block_size: int = 32) -> torch.Tensor:
    """Boolean [query t, key j] matrix of the keys a policy keeps; every policy is causal (j ≤ t).

    window_tokens None: full attention.
    token: j < S or t − W < j ≤ t (the exact StreamingLLM cache; window-only is S = 0).
    block: what vLLM attends to after block-table compaction (DESIGN): the sink blocks,
        j < ceil(S / bs)·bs, and the window from the first block it still needs, i.e. the block
        holding the oldest window token max(0, t − W + 1):
        j ≥ floor(max(0, t − W + 1) / bs)·bs.
        So up to bs − 1 extra old keys in the window and the sinks rounded up to whole blocks.
    """
    t = torch.arange(n_tokens)[:, None]
    j = torch.arange(n_tokens)[None, :]
    causal = j <= t
    if window_tokens is None:
        return causal
    oldest_in_window = t - window_tokens + 1
    if granularity == "token":
        sink_end, window_start = sink_tokens, oldest_in_window
    elif granularity == "block":
        sink_end = math.ceil(sink_tokens / block_size) * block_size
        window_start = oldest_in_window.clamp(min=0) // block_size * block_size
    else:
        raise ValueError(f"granularity {granularity!r} is not one of {', '.join(GRANULARITIES)}")
    return causal & ((j < sink_end) | (j >= window_start))


def default_text_path() -> Path:
    """Debian's fortunes when installed (the larger text), else the GPL-3 text of base-files."""
    if FORTUNES_DIR.is_dir() and _fortune_files(FORTUNES_DIR):
        return FORTUNES_DIR
    if GPL3_FILE.is_file():
        return GPL3_FILE
    raise ValueError(f"no local English text: install Debian's fortunes or pass --text PATH "
                     f"(looked for {FORTUNES_DIR} and {GPL3_FILE})")


def _fortune_files(folder: Path) -> list[Path]:
    """Fortune files in name order; `.dat` files are strfile indexes and the `.u8` names are
    symlinks to the same texts."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.is_symlink() and p.suffix != ".dat")


def _clean_line(line: str) -> str:
    """Resolve terminal overstrike (`___\\b\\b\\band` prints `and`): a backspace erases the
    character before it, so the model reads what a terminal shows."""
    if "\b" not in line:
        return line
    kept: list[str] = []
    for char in line:
        if char == "\b":
            if kept:
                kept.pop()
        else:
            kept.append(char)
    return "".join(kept)


def read_text(path: Path, max_chars: int | None = None) -> tuple[str, bool]:
    """The text of a file, or of a folder of fortune files concatenated in name order.

    A line that is only `%` (the fortune separator) becomes a blank line, so fortunes stay
    apart as paragraphs. Reading stops at the first line end after `max_chars`; returns the
    text and whether it is complete.
    """
    files = _fortune_files(path) if path.is_dir() else [path]
    lines: list[str] = []
    n_chars = 0
    for file in files:
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
            line = "\n" if line.rstrip("\r\n") == FORTUNE_SEPARATOR else _clean_line(line)
            lines.append(line)
            n_chars += len(line)
            if max_chars is not None and n_chars >= max_chars:
                return "".join(lines), False
        if lines and not lines[-1].endswith("\n"):
            lines.append("\n")  # a file without a final newline must not run into the next
    return "".join(lines), True


def load_token_ids(tokenizer, path: Path, n_tokens: int) -> torch.Tensor:
    """The first `n_tokens` tokens of the text. No BOS is added: the stream is the text."""
    max_chars = n_tokens * CHARS_PER_TOKEN_GUESS
    while True:
        text, complete = read_text(path, max_chars)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        # Strictly more than wanted when cut: the last word before the cut may tokenize
        # differently from the same word in the whole text.
        if len(ids) > n_tokens or (complete and len(ids) == n_tokens):
            return torch.tensor(ids[:n_tokens])
        if complete:
            raise ValueError(f"tokens {n_tokens} exceed the {len(ids)} tokens of text {path}; "
                             f"allowed: tokens ≤ {len(ids)}")
        max_chars *= 4


def load_model(model_path: Path, dtype: str | None = None):
    """This machine's type (engine/dtype.py: bf16 only where the CPU computes it natively;
    `dtype` overrides it, as --vllm-arg dtype=… does for vLLM) with
    SDPA attention, which takes a custom 4D float mask as given (transformers returns a 4D mask
    unchanged and SDPA then applies it instead of its own causal mask)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.dtype import for_host, torch_dtype

    choice = for_host(dtype)
    logger.info("quality: model in %s", choice.reason)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch_dtype(choice.dtype), attn_implementation="sdpa").eval()
    return tokenizer, model


def streaming_perplexity(model, token_ids: torch.Tensor, visible: torch.Tensor,
                         first_scored_position: int) -> float:
    """exp(mean NLL) of token t + 1 predicted at query t, for t ≥ first_scored_position, in one
    forward pass where query t attends to exactly the keys `visible[t]`."""
    n_tokens = len(token_ids)
    mask = torch.zeros((1, 1, n_tokens, n_tokens), dtype=model.dtype)
    mask.masked_fill_(~visible, float("-inf"))  # additive: 0 keeps a key, −inf drops it
    with torch.inference_mode():
        logits = model(input_ids=token_ids[None], attention_mask=mask,
                       position_ids=torch.arange(n_tokens)[None], use_cache=False,
                       logits_to_keep=n_tokens - first_scored_position).logits[0]
    # The last position has nothing after it to predict.
    nll = F.cross_entropy(logits[:-1].float(), token_ids[first_scored_position + 1:])
    return math.exp(nll.item())


def measure(settings: QualitySettings) -> dict:
    """Perplexity under the three policies, with the settings and the text used; logs progress."""
    started = time.perf_counter()
    model_path = resolve_model(settings.model)
    text_path = Path(settings.text_path) if settings.text_path else default_text_path()
    tokenizer, model = load_model(model_path)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and settings.n_tokens > max_positions:
        raise ValueError(f"tokens {settings.n_tokens} exceed the {max_positions} positions of "
                         f"model {settings.model}; allowed: tokens ≤ {max_positions}")
    token_ids = load_token_ids(tokenizer, text_path, settings.n_tokens)
    window, sinks, n_tokens = settings.window_tokens, settings.sink_tokens, settings.n_tokens
    policies = (  # (JSON name, log label, kept keys)
        ("full", "full attention", kept_keys(n_tokens)),
        ("window", "window-only", kept_keys(n_tokens, window, 0, settings.granularity,
                                            settings.block_size)),
        ("sinks", "sinks+window", kept_keys(n_tokens, window, sinks, settings.granularity,
                                            settings.block_size)),
    )
    result = {
        "model": settings.model, "model_path": str(model_path), "window": window,
        "sinks": sinks, "tokens": n_tokens, "block_size": settings.block_size,
        "granularity": settings.granularity, "text_source": str(text_path),
        "first_scored_position": settings.first_scored_position,
        "scored_positions": n_tokens - 1 - settings.first_scored_position,
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    for i, (name, label, visible) in enumerate(policies, start=1):
        logger.info("quality %d/3: %s over %d tokens (W=%d, S=%d, %s granularity)...",
                    i, label, n_tokens, window, sinks, settings.granularity)
        pass_started = time.perf_counter()
        ppl = streaming_perplexity(model, token_ids, visible, settings.first_scored_position)
        logger.info("quality %d/3: %s perplexity %.2f in %.1f s", i, label, ppl,
                    time.perf_counter() - pass_started)
        result[f"ppl_{name}"] = ppl
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    return result
