"""The per-tick rows the run writes (`ticks`, `rank_ticks`), typed: a field per column of
store/schema.py (tests/runtime/test_tick_rows.py holds them to it), so a misspelt or missing
column fails where the row is built, not as a NULL column in the store.

The writer and the observers take plain dicts (`as_row`): the store's boundary. Frame rows stay
dicts for now: built in two shapes per frame on the hot path and read back by the recorder.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RankTickRow", "TickRow"]


@dataclass(frozen=True)
class TickRow:
    """One `ticks` row: the whole engine's pool and the loop's counters at a tick."""

    run_id: str
    tick: int
    t: float
    live: int
    limit_sessions: int
    occupancy: float
    used_blocks: int
    total_blocks: int
    running: int
    waiting: int
    paused: int
    admitted: int
    rejected: int
    evicted: int
    overrun_ms: float
    tokens_out: int
    frames_waiting: int
    stalled: bool
    p95_ms: float | None
    n_star: int | None
    # Since the last tick (Recorder.take_tick_silent): the silent share and counts per cause.
    silent_rate: float | None
    silent_memory: int
    silent_compute: int
    silent_guard: int
    silent_other: int
    tsat_s: float | None
    rho_slope_per_s: float | None
    window_tokens: int | None
    sink_tokens: int | None

    def as_row(self) -> dict:
        return dict(vars(self))


@dataclass(frozen=True)
class RankTickRow:
    """One `rank_ticks` row: a data-parallel rank's pool at a tick (runs with > 1 rank)."""

    run_id: str
    tick: int
    t: float
    rank: int
    live: int
    occupancy: float
    used_blocks: int
    total_blocks: int
    running: int
    waiting: int
    paused: int
    tokens_out: int
    frames_waiting: int
    stalled: bool
    frames: int
    silent_frames: int
    tsat_s: float | None
    rho_slope_per_s: float | None

    def as_row(self) -> dict:
        return dict(vars(self))
