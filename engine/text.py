"""The model's text: input text as ids, output ids as text, incrementally.

A gateway sends each frame's words as they come. Decoding ids one delta at a time would break
a character whose bytes span two deltas (byte-level BPE) and lose the spaces a tokenizer
merges across tokens; `tokenizers`' DecodeStream (what vLLM's fast incremental detokenizer is
built on) emits text only once it is whole, so the deltas of a session add up to the decode
of all its ids.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


class TextCodec:
    """One model's tokenizer (its `tokenizer.json`), shared by every session; thread-safe for
    `encode` and for decoders used by one thread each."""

    def __init__(self, tokenizer_dir: str | Path, vocab_size: int) -> None:
        from tokenizers import Tokenizer

        path = Path(tokenizer_dir) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"no tokenizer.json in {tokenizer_dir}: the model's output ids "
                             "cannot be decoded")
        self._tokenizer = Tokenizer.from_file(str(path))
        self.vocab_size = vocab_size  # the engine's: ids at or above it are not the model's

    def encode(self, text: str) -> list[int]:
        """Text as the model's ids (no special tokens added); ids the engine would refuse (at
        or above its vocabulary) are left out."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [i for i in ids if i < self.vocab_size]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self._tokenizer)


class StreamDecoder:
    """One session's output, decoded as it comes: `step(ids)` returns the text those ids
    complete (possibly empty: a character still waiting for its next byte)."""

    def __init__(self, tokenizer) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)

    def step(self, ids: list[int]) -> str:
        out = []
        for i in ids:
            try:
                piece = self._stream.step(self._tokenizer, i)
            except Exception as exc:  # noqa: BLE001 - an id the tokenizer cannot take
                logger.warning("id %s cannot be decoded: %s", i, exc)
                continue
            if piece:
                out.append(piece)
        return "".join(out)
