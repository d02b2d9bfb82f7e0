"""The frame-source interface every load implements: one frame per frame period."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Frame:
    """What a frame source yields once per frame period."""

    token_ids: list[int]
    t_media_s: float  # position in the source's own timeline (audio seconds, frame index·T)
    voice_active: bool = True
    # The frame's audio at the model rate (float32, mono) for audio sources; None for synthetic
    # token frames. Not part of equality: two frames are the same when their tokens are.
    audio: np.ndarray | None = field(default=None, compare=False, repr=False)


@runtime_checkable
class FrameSource(Protocol):
    """Synthetic tokens, WAV replay and the microphone all look like this to the runtime.

    `next_frame` is called once per frame period, paced by the metronome (never by the source),
    and returns None once the source has ended; `end_reason` then says why when the source knows
    better than "source ended" (a remote client that left), else None. `close` releases what the
    source holds (an audio device); it is idempotent.
    """

    end_reason: str | None

    def next_frame(self, frame_s: float) -> Frame | None: ...

    def close(self) -> None: ...
