"""The per-tick open budget: at most `per_tick` sessions start in any one tick; the rest wait
for the next tick with room (queued, never rejected: admission already said yes).

Why: a session's first chunk is a new request (vLLM creates and schedules it; the twin charges
`CostModel.open_ms` for it) and it lands in the same engine step as every live session's frame
of that tick. A burst of k opens in one tick costs each live session k opens' worth of that
step, so a burst can silence sessions that were served on time. Spreading opens over ticks
bounds what one tick's arrivals cost the others, at the price of a late start of a few ticks.
Opens with no session started before their tick have no one to silence but each other: they
are not held back (a fixed load still starts together, as calibration probes need).
"""

from __future__ import annotations

import math


class OpenBudget:
    """Places a session's start in the first tick (at or after the asked start) with room."""

    def __init__(self, per_tick: int, frame_s: float) -> None:
        if per_tick < 1:
            raise ValueError(f"open budget {per_tick} per tick must be ≥ 1")
        if frame_s <= 0:
            raise ValueError(f"frame period {frame_s} s must be > 0")
        self.per_tick = per_tick
        self.frame_s = frame_s
        self._opens: dict[int, int] = {}  # tick index → sessions starting in it
        self.deferred = 0  # opens moved to a later tick than asked (a count for the record)

    def place(self, start_s: float, live_starts=None) -> float:
        """The run-relative start to use for a session asked to start at `start_s`: the same
        phase within its tick, in the first tick that still has room. `live_starts`: the live
        sessions' starts; unless one started before that tick nobody is there to protect
        (None: assume someone is)."""
        tick = math.floor(start_s / self.frame_s + 1e-9)
        others_started = live_starts is None or any(
            s < tick * self.frame_s - 1e-9 for s in live_starts)
        for old in [k for k in self._opens if k < tick - 1]:
            del self._opens[old]  # starts are asked in time order: older ticks are done
        shift = 0
        while others_started and self._opens.get(tick + shift, 0) >= self.per_tick:
            shift += 1
        self._opens[tick + shift] = self._opens.get(tick + shift, 0) + 1
        if shift:
            self.deferred += 1
        return start_s + shift * self.frame_s
