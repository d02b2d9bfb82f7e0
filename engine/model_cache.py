"""Where built models live, and the seeded text their tokenizers are trained on (shared by the
bundled text and audio models, so neither builder imports the other's module)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """Where built models live: outside git, shared by all checkouts of this user."""
    root = os.environ.get("METRONOME_MODEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "metronome" / "models"


@contextlib.contextmanager
def building(out: Path, prefix: str):
    """A fresh folder beside `out` to build a model in; renamed to `out` when the block ends
    without an error (atomic: a crash mid-build never leaves a half model in the cache),
    removed when it raises."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def synthetic_corpus(seed: int, n_words: int = 60_000) -> list[str]:
    """English-ish text from a seeded generator, so the tokenizer is the same on every machine."""
    rng = random.Random(seed)
    syllables = ["ta", "ne", "ri", "so", "ka", "lu", "me", "th", "in", "er", "an", "re", "on",
                 "at", "en", "nd", "ti", "es", "or", "te", "of", "ed", "is", "it", "al", "ar"]
    common = ["the", "and", "of", "to", "a", "in", "is", "that", "for", "it", "as", "with", "on",
              "be", "by", "this", "are", "or", "not", "you", "frame", "session", "window"]
    vocab = common + ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
                      for _ in range(3000)]
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]  # Zipf-like
    lines, line = [], []
    for word in rng.choices(vocab, weights=weights, k=n_words):
        line.append(word)
        if len(line) >= rng.randint(8, 16):
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    return lines
