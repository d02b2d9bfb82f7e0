"""Recording a run: each frame's outcome (this is where a frame's latency is decided), events,
and the counters the summary reads.

Rows go to the store's writer queue (held while the loop handles one instant, then one put per
table: `hold`) and at once to any observers (e.g. the Prometheus exporter); the run thread
never waits on DuckDB. A frame is finalised once its deadline has passed (at its
session's next frame time, or at close), so `tokens_by(deadline)` is what it had on time.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import Counter
from dataclasses import dataclass, field

from engine.contract import FrameHandle
from runtime.config import RunConfig
from runtime.reasons import Close

logger = logging.getLogger(__name__)


# Why a frame went silent (no output token by its deadline):
#   memory   the pool was full (ρ ≥ control.signals.FULL_OCCUPANCY at the last tick before the
#            frame was finalised): its tokens had no blocks to go to, or its session waited;
#   compute  the pool had room, but the step that would serve it ran past the deadline;
#   guard    its session was evicted by the stall guard while the frame was owed;
#   other    the session failed (an engine error for that session).
SILENT_CAUSES = ("memory", "compute", "guard", "other")


@dataclass
class Totals:
    """Run-wide counters: the loop keeps these, never per-frame lists (flat memory)."""

    frames: int = 0
    silent: int = 0
    censored: int = 0  # no answer by the time the frame was finalised: latency unknown
    late: int = 0  # answered after the deadline: the true (late) latency is known
    on_time: int = 0
    naive_on_time: int = 0
    evicted: int = 0
    rollovers: int = 0
    overruns: int = 0
    max_overrun_ms: float = 0.0
    max_occupancy: float = 0.0
    silent_by_cause: dict = field(default_factory=lambda: dict.fromkeys(SILENT_CAUSES, 0))


class Recorder:
    """Turns what happened into rows. One per run; used from the run thread only."""

    def __init__(self, run_id: str, config: RunConfig, writer, observers=()) -> None:
        self.run_id = run_id
        self.config = config
        self.writer = writer
        self.observers = tuple(observers)  # each has observe(table, row)
        self.totals = Totals()
        self.t0 = 0.0  # engine clock at the run's start; set by the loop
        self._tick_frames = 0  # frames finalised since the last tick (silent rate per tick)
        self._tick_silent = 0
        self._tick_causes = dict.fromkeys(SILENT_CAUSES, 0)
        # Each pool full at the last tick (ρ ≥ FULL_OCCUPANCY; set by telemetry), by rank; None:
        # the whole engine's, for frames whose rank the engine did not say.
        self.pool_full: dict[int | None, bool] = {}
        # Frames and silent frames per rank, for the run and since the last tick.
        self.rank_frames: Counter = Counter()
        self.rank_silent: Counter = Counter()
        self._tick_rank_frames: Counter = Counter()
        self._tick_rank_silent: Counter = Counter()
        self._held: dict[str, list[dict]] | None = None  # rows of this instant (hold)

    # --- rows ---------------------------------------------------------------------------------
    def hold(self, on: bool) -> None:
        """While on, rows wait here until `release` (the loop's end of an instant) instead of
        going to the writer one by one: each put wakes the writer thread, and a wake inside a
        burst of submits takes the GIL between them (benchmarks/frame_floor.py, due to submit).
        Off releases what is held."""
        if not on:
            self.release()
        self._held = {} if on else None

    def release(self) -> None:
        """Hand the held rows to the writer, one batch per table, in the order they came."""
        if not self._held:
            return
        held, self._held = self._held, {}
        for table, rows in held.items():
            self.writer.add_many(table, rows)

    def add(self, table: str, row: dict) -> None:
        if self._held is not None:
            self._held.setdefault(table, []).append(row)
        else:
            self.writer.add(table, row)
        for observer in self.observers:
            try:
                observer.observe(table, row)
            except Exception:  # noqa: BLE001 - an observer must never break the run
                # Logged once and dropped: metrics must neither end a run nor flood its log.
                logger.exception("observer %r failed on a %s row; dropped", observer, table)
                self.observers = tuple(o for o in self.observers if o is not observer)

    def event(self, t_rel: float, kind: str, **detail) -> None:
        self.add("events", {
            "run_id": self.run_id, "t": t_rel, "wall_at": dt.datetime.now(), "kind": kind,
            "detail": json.dumps(detail, default=str)})

    # --- frames -------------------------------------------------------------------------------
    def frame(self, session_id: int, idx: int, t_sub_rel: float, handle: FrameHandle | None,
              now: float, closing: str | None = None, rank: int | None = None,
              origin: str | None = None) -> dict:
        """Record one frame whose deadline has passed. `handle` None: the frame could not even
        be submitted (the engine still owed the session's previous one). Returns the row.

        `latency_ms` is the true latency when the frame completed by `now`, else None with
        `censored` true: `latency_bound_ms` is then a lower bound (≥ budget), never a value.
        `closing`: why the session is closing when this frame is finalised at its close.
        `rank`: the data-parallel rank the session lives on (None: unknown); `origin`: where
        the session came from (the load kind, or "gateway")."""
        cfg = self.config
        budget_s = cfg.budget / 1e3
        row = {"run_id": self.run_id, "session_id": session_id, "frame_idx": idx,
               "t_submit": t_sub_rel, "deadline": t_sub_rel + budget_s,
               "tokens_expected": cfg.tokens_out, "skipped": handle is None, "rank": rank,
               "origin": origin or cfg.load}
        if handle is None:
            # Never submitted, never answered: its latency is unknown and at least the budget
            # (censored); a gateway with a wait budget answers empty and calls it on time.
            bound_ms = cfg.budget
            naive_ms = cfg.wait_budget * cfg.budget if cfg.wait_budget else bound_ms
            row.update(t_first=None, t_done=None, latency_ms=None, latency_bound_ms=bound_ms,
                       out_ids=None,
                       censored=True, tokens_out=0, on_time=False, silent=True, complete=False,
                       naive_latency_ms=naive_ms, naive_on_time=cfg.wait_budget is not None)
        else:
            deadline = handle.t_submit + budget_s
            complete = handle.done_by(now) and handle.error is None
            n_out = handle.tokens_by(deadline)
            # Done by now: the true latency, late or not. Not done: all we know is that it is
            # at least the time waited so far (≥ budget, since now is past the deadline).
            bound_ms = ((handle.t_done if complete else now) - handle.t_submit) * 1e3
            on_time = complete and handle.t_done <= deadline
            naive_ms = min(bound_ms, cfg.wait_budget * cfg.budget) if cfg.wait_budget \
                else bound_ms
            t_first = handle.t_first
            ids = handle.token_ids
            row["out_ids"] = list(ids[:n_out]) if len(ids) >= n_out else None
            row.update(
                t_first=None if t_first is None else t_first - self.t0,
                t_done=handle.t_done - self.t0 if complete else None,
                latency_ms=bound_ms if complete else None, latency_bound_ms=bound_ms,
                censored=not complete, naive_latency_ms=naive_ms, tokens_out=n_out,
                on_time=on_time, naive_on_time=naive_ms <= cfg.budget + 1e-9,
                silent=n_out == 0, complete=complete)
        row["silent_cause"] = self._cause(handle, closing, rank) if row["silent"] else None
        tot = self.totals
        tot.frames += 1
        if row["silent"]:
            tot.silent_by_cause[row["silent_cause"]] += 1
            self._tick_causes[row["silent_cause"]] += 1
        tot.silent += row["silent"]
        tot.on_time += row["on_time"]
        tot.censored += row["censored"]
        tot.late += row["complete"] and not row["on_time"]
        tot.naive_on_time += bool(row["naive_on_time"])
        self._tick_frames += 1
        self._tick_silent += row["silent"]
        if rank is not None:
            self.rank_frames[rank] += 1
            self.rank_silent[rank] += row["silent"]
            self._tick_rank_frames[rank] += 1
            self._tick_rank_silent[rank] += row["silent"]
        self.add("frames", row)
        return row

    def _cause(self, handle: FrameHandle | None, closing: str | None,
               rank: int | None = None) -> str:
        if closing == Close.EVICTED:
            return "guard"
        if handle is not None and handle.failed:
            return "other"
        # Its own rank's pool when known, else the whole engine's.
        full = self.pool_full.get(rank, self.pool_full.get(None, False))
        return "memory" if full else "compute"

    def take_rank_tick(self, rank: int) -> tuple[int, int]:
        """Frames and silent frames finalised on `rank` since the last call."""
        out = self._tick_rank_frames.pop(rank, 0), self._tick_rank_silent.pop(rank, 0)
        return out

    def take_tick_silent(self) -> dict:
        """Since the last call: the share of finalised frames that were silent (None: none)
        and the silent frames per cause (tick columns silent_rate, silent_<cause>)."""
        rate = self._tick_silent / self._tick_frames if self._tick_frames else None
        out = {"silent_rate": rate, **{f"silent_{c}": n for c, n in self._tick_causes.items()}}
        self._tick_frames = self._tick_silent = 0
        self._tick_causes = dict.fromkeys(SILENT_CAUSES, 0)
        return out
