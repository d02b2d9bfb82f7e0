"""Why a session closed: the reasons the runtime itself decides, as one vocabulary.

Control flow compares these members, never free text: the recorder tells the stall guard's
silence by `Close.EVICTED`, and a frame cut off at the run's end by `Close.RUN_ENDED`. Other
closes carry free text for the record (a session's engine error, a remote client's own reason).
"""

from __future__ import annotations

from enum import StrEnum


class Close(StrEnum):
    SESSION_ENDED = "session ended"  # its planned length is over
    RUN_ENDED = "run ended"
    SOURCE_ENDED = "source ended"  # its frame source has no more frames
    EVICTED = "evicted by stall guard"
    MAX_MODEL_LEN = "max_model_len"  # unbounded KV cannot roll over


# Closes that are part of a session's normal life; others are recorded as `close` events.
QUIET_CLOSES = frozenset({Close.SESSION_ENDED, Close.RUN_ENDED, Close.SOURCE_ENDED})
