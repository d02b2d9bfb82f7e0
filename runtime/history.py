"""What a session keeps on the host to roll over: its first S input tokens (the sinks) and its
last W (the window), as the KV held them (DESIGN: sinks + window). A rolled-over session starts
again from them.

An audio-in model's KV came from audio through its encoder, so its history is whole frames with
their audio, and a rollover re-encodes them: ceil(S / F) sink frames and W // F window frames of
F tokens each (a frame cannot be cut, so the sinks round up to a whole frame and the window
down to one).
"""

from __future__ import annotations

from collections import deque


class RolloverHistory:
    """One session's rollover prompt, kept bounded (W + S tokens, or their frames)."""

    def __init__(self, window_tokens: int, sink_tokens: int,
                 frame_ids: tuple[int, ...] | None = None) -> None:
        if window_tokens < 1 or sink_tokens < 0:
            raise ValueError(f"history of W={window_tokens} S={sink_tokens} tokens; allowed: "
                             "W ≥ 1, S ≥ 0")
        self.frame_ids = frame_ids  # None: token ids (a text model)
        self.sink_target = sink_tokens  # S when it opened, lowered by live S shrinks
        self.sinks: list = []  # the first S tokens (text) or their frames' audio (audio)
        self.window: deque = deque(maxlen=self._window_len(window_tokens))
        self.seen = 0  # inputs so far, tokens or frames (to tell sinks and window apart early)

    def _window_len(self, window_tokens: int) -> int:
        if self.frame_ids is None:
            return window_tokens
        return max(1, window_tokens // len(self.frame_ids))

    def _sink_len(self) -> int:
        if self.frame_ids is None:
            return self.sink_target
        return -(-self.sink_target // len(self.frame_ids))

    @property
    def sink_tokens(self) -> int:
        """Tokens the sinks hold now (whole frames for an audio-in model)."""
        return len(self.sinks) * (1 if self.frame_ids is None else len(self.frame_ids))

    def add(self, tokens: list[int], audio=None) -> None:
        """One frame's input: its token ids, and an audio-in model's frame audio."""
        items = list(tokens) if self.frame_ids is None else [audio]
        self.window.extend(items)
        if len(self.sinks) < self._sink_len():
            self.sinks.extend(items[:self._sink_len() - len(self.sinks)])
        self.seen += len(items)

    def prompt(self) -> tuple[list[int], list | None]:
        """The rollover prompt: ids, and an audio-in model's audio per frame (else None).
        Early on sinks and window overlap: no repeats."""
        overlap = max(0, len(self.sinks) + len(self.window) - self.seen)
        items = self.sinks + list(self.window)[overlap:]
        if self.frame_ids is None:
            return items, None
        return list(self.frame_ids) * len(items), items

    def follow(self, window_tokens: int, sink_tokens: int) -> None:
        """After a live W/S change: the window follows the new W; sinks only shrink (the engine
        freed the rest, as vLLM's carried state does)."""
        self.window = deque(self.window, maxlen=self._window_len(window_tokens))
        self.sink_target = min(self.sink_target, sink_tokens)
        del self.sinks[self._sink_len():]
