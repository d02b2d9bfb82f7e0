"""Which request each batch row is, while one step's attention metadata is built.

Metadata builders see rows, not requests; after a live W/S change (`engine.sinks.live`) the
compaction needs each row's request to apply what that request still holds. This module owns
both halves: the model-runner hook that names the rows, and the lookup builders read.
"""

from __future__ import annotations

import functools

_MARK = "_metronome_names_rows"

# Request id of each row of the batch being built, set by the runner hook for the duration of
# one metadata build (builds run on the runner's thread, one at a time).
_row_req_ids: list[str] | None = None


def row_req_ids() -> list[str] | None:
    """The rows' request ids during a build by a hooked runner, else None."""
    return _row_req_ids


def set_row_req_ids(req_ids: list[str] | None) -> None:
    global _row_req_ids
    _row_req_ids = req_ids


def name_batch_rows(runner_cls) -> None:
    """Make a model runner class tell builders which request each batch row is. Idempotent."""
    original = runner_cls._build_attention_metadata
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def build_attention_metadata(self, *args, **kwargs):
        set_row_req_ids(self.input_batch.req_ids)
        try:
            return original(self, *args, **kwargs)
        finally:
            set_row_req_ids(None)

    setattr(build_attention_metadata, _MARK, True)
    runner_cls._build_attention_metadata = build_attention_metadata
