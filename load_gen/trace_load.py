"""Replay: re-offer a recorded run's sessions, or a trace file's, against other settings.

A trace is what a load offered: when each session arrived, how many frames it sent, and the
tokens in and out of each frame. The runtime sees it like any load: `arrival_times` gives the
arrivals (session i is the i-th), and each session's `ReplayFrames` yields its frames until the
recorded count and then None, so the runner closes it with "source ended". Token ids are drawn
from the same seeded generator as synthetic load (load_gen.synthetic), so a replay of a synthetic
run with the recorded seed submits the very same tokens.

From a recorded run (`--replay-run`), the trace is built from the store:
- arrivals are recomputed from the run's recorded settings (the generators are seeded), because
  admission happened at arrival, before a session's first frame; each session's recorded first
  frame is checked against them, so a replay that would not be exact is refused;
- a session's length is its recorded frames, except that a session the system turned away or
  cut short (reject, stall-guard evict, session error, max_model_len) or that ran to the run's
  end is offered for its planned length: those ends are outcomes of the settings, not load;
- tokens out per frame are the recorded `tokens_expected`; tokens in are the run's.
A run that replayed another run has that run's trace (the load is the same by construction).
An audio run (wav, mic) replays its timing and token counts with synthetic token ids.

From a trace file (`--replay-trace`, CSV or Parquet) with columns session_id, start_s, end_s,
tokens_in, tokens_out: one row per session (frames every period from start_s while < end_s),
or one row per frame (session_id repeats; rows in start_s order, or frame_idx order when that
column is present). Session i of the replay is the trace's i-th session by start time.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from load_gen.frames import Frame
from load_gen.generated import SyntheticFrames, session_seed
from load_gen.trace_file import MAX_SESSIONS, TRACE_COLUMNS, TRACE_SUFFIXES, read_sessions  # noqa: F401

logger = logging.getLogger(__name__)

# The load fields a recording fixes; a replay takes them unless the operator sets them.
RECORDED_FIELDS = ("frame_ms", "tokens_in", "tokens_out", "sessions", "duration_s", "seed",
                   "session_s", "stagger")


@dataclass(frozen=True)
class ReplaySession:
    frames: int
    # One count for every frame, or one per frame (a trace file's: a memoryview of uint16).
    tokens_in: int | tuple[int, ...] | memoryview
    tokens_out: int | tuple[int, ...]

    def tokens_in_at(self, k: int) -> int:
        return self.tokens_in if isinstance(self.tokens_in, int) else int(self.tokens_in[k])

    def tokens_out_at(self, k: int) -> int:
        return self.tokens_out if isinstance(self.tokens_out, int) else self.tokens_out[k]


@dataclass(frozen=True)
class ReplayTrace:
    source: str  # "run ID" or "trace PATH", for messages
    arrivals: tuple[float, ...]  # seconds from run start, session i at arrivals[i]
    sessions: tuple[ReplaySession, ...]
    frame_ms: float | None = None  # recorded runs: the period the trace is bound to
    stagger: bool | None = None  # recorded runs: whether starts kept their arrival phase
    settings: dict = field(default_factory=dict, compare=False)  # RECORDED_FIELDS it fixes

    def tokens_out_values(self) -> set[int]:
        values: set[int] = set()
        for s in self.sessions:
            values.update([s.tokens_out] if isinstance(s.tokens_out, int) else s.tokens_out)
        return values


class ReplayFrames:
    """One session of a trace as a frame source: its recorded frames, then None."""

    end_reason: str | None = None  # FrameSource: it ends when its frames do ("source ended")

    def __init__(self, trace: ReplayTrace, session_id: int, seed: int, vocab_size: int) -> None:
        if not 0 <= session_id < len(trace.sessions):
            raise ValueError(f"session {session_id} is not in {trace.source} "
                             f"({len(trace.sessions)} sessions)")
        self._session = trace.sessions[session_id]
        self._ids = SyntheticFrames(session_seed(seed, session_id), vocab_size, 1)
        self._index = 0

    def next_frame(self, frame_s: float) -> Frame | None:
        if self._index >= self._session.frames:
            return None
        frame = Frame(self._ids.draw(self._session.tokens_in_at(self._index)),
                      self._index * frame_s)
        self._index += 1
        return frame

    def close(self) -> None:
        """Nothing to release."""


def check_config(trace: ReplayTrace, frame_ms: float, tokens_out: int, stagger: bool) -> None:
    """Refuse settings under which the replay would not offer the traced load."""
    if trace.frame_ms is not None and not math.isclose(frame_ms, trace.frame_ms):
        raise ValueError(f"frame period {frame_ms:g} ms differs from {trace.source}'s "
                         f"{trace.frame_ms:g} ms; a replay keeps the recorded frame period")
    values = trace.tokens_out_values()
    if len(values) > 1:
        # The runner answers every frame of a run with one tokens_out (RunConfig.tokens_out).
        raise ValueError(f"{trace.source} asks {min(values)}–{max(values)} tokens out per "
                         f"frame; a run answers every frame with one tokens out")
    if values and tokens_out not in values:
        raise ValueError(f"tokens out {tokens_out} differs from {trace.source}'s "
                         f"{values.pop()} per frame")
    if trace.stagger is not None and stagger != trace.stagger:
        raise ValueError(f"stagger {'on' if stagger else 'off'} differs from {trace.source}'s "
                         f"{'on' if trace.stagger else 'off'}; its sessions would start at "
                         f"other times")


def session_start(arrival: float, session_id: int, frame_s: float, stagger: bool,
                  load: str) -> float:
    """When the runtime starts a session that arrived at `arrival` (runtime/loop.py
    Runner._on_arrive): the next tick, or with stagger its arrival (plus a phase of
    (id mod 8)/8 of a period for load fixed). A recording that disagrees is refused."""
    if stagger:
        return arrival + (session_id % 8) / 8 * frame_s if load == "fixed" else arrival
    return math.ceil(arrival / frame_s - 1e-9) * frame_s


def compact_counts(values: list[int], default: int) -> int | tuple[int, ...]:
    if not values:
        return default
    return values[0] if len(set(values)) == 1 else tuple(values)


# --- trace files (read and validated by DuckDB: load_gen/trace_file.py) --------------------
def file_trace(path: str, frame_ms: float) -> ReplayTrace:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"trace file {path} does not exist")
    if p.suffix.lower() not in TRACE_SUFFIXES:
        raise ValueError(f"trace file {path} must be {' or '.join(TRACE_SUFFIXES)}")
    st = p.stat()
    # Size and mtime in the key: a trace rewritten in place is read again.
    return _file_trace(str(p.resolve()), st.st_mtime_ns, st.st_size, float(frame_ms))


# One trace kept: RunConfig validates it and the runner then plays it, so it is read once per
# run; a second trace replaces the first (a trace can hold millions of frames).
@lru_cache(maxsize=1)
def _file_trace(path: str, _mtime_ns: int, _size: int, frame_ms: float) -> ReplayTrace:
    t = read_sessions(path, frame_ms)
    frame_s = frame_ms / 1e3
    sessions = tuple(ReplaySession(n, tin, t["tokens_out"])
                     for n, tin in zip(t["frames"], t["tokens_in"]))
    arrivals = tuple(t["starts"])
    # Long enough for the last session's last frame, one period of slack for its start tick.
    duration = max(a + s.frames * frame_s for a, s in zip(arrivals, sessions)) + frame_s
    settings = {"sessions": len(sessions), "duration_s": round(duration, 6),
                "tokens_in": t["tokens_in_mode"], "tokens_out": t["tokens_out"],
                "session_s": None}
    return ReplayTrace(f"trace {Path(path).name}", arrivals, sessions, None, None, settings)


