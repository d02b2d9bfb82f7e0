"""What one run's rows add up to, as Prometheus will see it: counters, fixed-bucket histograms
and the latest tick's gauges. Pure bookkeeping; nothing here knows about HTTP or the registry.

Rows are the ones the runner hands to the store (tables frames, ticks, events), read with
`.get` so rows from before and after a schema change (e.g. `censored`, `window_tokens`) both
work.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field

# A frame budget is tens of milliseconds: the buckets resolve 5–200 ms finely and keep going
# to 2 s so a slow engine still lands in a bucket below +Inf.
FRAME_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.16,
                           0.2, 0.3, 0.5, 1.0, 2.0)
# A tick is on time at 0 overrun; anything past half a frame period is late.
TICK_OVERRUN_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)

FRAME_OUTCOMES = ("on_time", "late", "silent")
_REASON_CHARS = re.compile(r"[^a-z0-9]+")
MAX_REASON_CHARS = 40


def reason_label(text) -> str:
    """A bounded label value for a free-text reason: the part before the first ':' as a slug
    ("stall guard: pool stalled, …" → "stall_guard"), so per-session numbers in a message never
    become new series."""
    head = str(text or "unknown").split(":", 1)[0].strip().lower()
    slug = _REASON_CHARS.sub("_", head).strip("_")[:MAX_REASON_CHARS]
    return slug or "unknown"


def frame_censored(row: dict) -> bool:
    """True when the frame's latency is unknown or only a lower bound, so it must stay out of
    the latency histogram. Uses the runner's `censored` column when there is one; before that
    column, a frame that was not complete at finalisation (skipped, still owed, closed) has a
    latency measured up to "now", which is a lower bound."""
    if "censored" in row and row["censored"] is not None:
        return bool(row["censored"]) or row.get("latency_ms") is None
    return row.get("latency_ms") is None or not row.get("complete", True)


def frame_outcome(row: dict) -> str:
    if row.get("silent"):
        return "silent"
    return "on_time" if row.get("on_time") else "late"


class Buckets:
    """A cumulative-on-export histogram: per-bucket counts, the sum, nothing else."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"histogram bounds {bounds} must be strictly increasing")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (Prometheus' `le`).
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            running += n
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), running))
        return out


@dataclass
class RunState:
    run_id: str
    engine: str = "unknown"
    model: str = "unknown"
    active: bool = True
    budget_s: float | None = None
    latency: Buckets = field(default_factory=lambda: Buckets(FRAME_LATENCY_BUCKETS_S))
    overrun: Buckets = field(default_factory=lambda: Buckets(TICK_OVERRUN_BUCKETS_S))
    frames: dict = field(default_factory=lambda: dict.fromkeys(FRAME_OUTCOMES, 0))
    censored: int = 0
    admitted: int = 0
    rejected: dict = field(default_factory=dict)  # reason → count
    evictions: dict = field(default_factory=dict)  # reason → count
    closes: dict = field(default_factory=dict)  # reason → count
    param_changes: dict = field(default_factory=dict)  # (setting, outcome) → count
    rollovers: int = 0
    stall_events: int = 0
    stall_onsets: int = 0  # ticks where `stalled` went from false to true
    was_stalled: bool = False
    ticks: int = 0
    gauges: dict = field(default_factory=dict)  # the latest tick's values, see on_tick
    window_tokens: float | None = None  # +Inf: unbounded; None: not known yet
    sink_tokens: float | None = None
    # Data parallelism (rank_ticks rows): each rank's latest gauges and silent frames so far.
    rank_gauges: dict = field(default_factory=dict)  # rank → {occupancy, tsat_s, stalled, live}
    rank_silent: dict = field(default_factory=dict)  # rank → silent frames (cumulative)
    silent_causes: dict = field(default_factory=dict)  # memory/compute/guard/other → frames

    @property
    def stalls(self) -> int:
        # Stall events (newer runners) and onsets seen in ticks (older ones) count the same
        # stalls; the larger is monotonic and never counts one stall twice.
        return max(self.stall_events, self.stall_onsets)

    def set_policy(self, window_tokens, sink_tokens) -> None:
        if window_tokens is None:  # unbounded: every token is kept, no sinks to speak of
            self.window_tokens, self.sink_tokens = math.inf, 0.0
        else:
            self.window_tokens = float(window_tokens)
            self.sink_tokens = float(sink_tokens or 0)

    # --- rows ---------------------------------------------------------------------------------
    def on_frame(self, row: dict) -> None:
        self.frames[frame_outcome(row)] += 1
        if row.get("silent") and row.get("silent_cause"):
            cause = str(row["silent_cause"])
            self.silent_causes[cause] = self.silent_causes.get(cause, 0) + 1
        if row.get("rank") is not None and row.get("silent"):
            rank = str(row["rank"])
            self.rank_silent[rank] = self.rank_silent.get(rank, 0) + 1
        if self.budget_s is None and row.get("deadline") is not None \
                and row.get("t_submit") is not None:
            self.budget_s = float(row["deadline"]) - float(row["t_submit"])
        if frame_censored(row):
            self.censored += 1
        else:
            self.latency.observe(float(row["latency_ms"]) / 1e3)

    def on_tick(self, row: dict) -> None:
        self.ticks += 1
        overrun_ms = row.get("overrun_ms")
        if overrun_ms is not None:
            self.overrun.observe(max(0.0, float(overrun_ms)) / 1e3)
        # Cumulative in the tick; max keeps the counter monotonic whatever the runner does.
        self.admitted = max(self.admitted, int(row.get("admitted") or 0))
        stalled = bool(row.get("stalled"))
        if stalled and not self.was_stalled:
            self.stall_onsets += 1
        self.was_stalled = stalled
        if "window_tokens" in row:  # runners that report the live W and S on every tick
            self.set_policy(row["window_tokens"], row.get("sink_tokens"))
        used, total = row.get("used_blocks"), row.get("total_blocks")
        tsat = row.get("tsat_s")
        self.gauges = {
            "occupancy": row.get("occupancy"),
            "used_blocks": used,
            "free_blocks": None if used is None or total is None else total - used,
            # None means "not rising": saturation is never, which Prometheus writes +Inf.
            "tsat_s": math.inf if tsat is None else float(tsat),
            "live": row.get("live"),
            "limit": row.get("limit_sessions"),
            "frames_waiting": row.get("frames_waiting"),
            "stalled": 1.0 if stalled else 0.0,
            "running": row.get("running"),
            "waiting": row.get("waiting"),
            "n_star": row.get("n_star"),  # None until the controller held a stable stretch
        }

    def on_rank_tick(self, row: dict) -> None:
        """One rank's tick (data-parallel runs): the gauges a router needs per rank."""
        rank = str(row.get("rank"))
        tsat = row.get("tsat_s")
        self.rank_gauges[rank] = {
            "occupancy": row.get("occupancy"), "live": row.get("live"),
            "tsat_s": math.inf if tsat is None else float(tsat),
            "stalled": 1.0 if row.get("stalled") else 0.0}

    def on_event(self, row: dict) -> None:
        kind = row.get("kind")
        try:
            detail = json.loads(row.get("detail") or "{}")
        except (TypeError, ValueError):
            detail = {}
        if not isinstance(detail, dict):
            detail = {}
        if kind == "start":
            if self.engine == "unknown" and detail.get("engine"):
                self.engine = str(detail["engine"])
        elif kind == "end":
            self.active = False
        elif kind == "reject":
            key = reason_label(detail.get("reason"))
            self.rejected[key] = self.rejected.get(key, 0) + 1
        elif kind == "evict":
            key = reason_label(detail.get("reason"))
            self.evictions[key] = self.evictions.get(key, 0) + 1
        elif kind == "close":
            key = reason_label(detail.get("reason"))
            self.closes[key] = self.closes.get(key, 0) + 1
        elif kind == "rollover":
            self.rollovers += 1
        elif kind == "stall":
            self.stall_events += 1
        elif kind in ("param_change", "param_rejected"):
            outcome = "applied" if kind == "param_change" else "rejected"
            key = (reason_label(detail.get("setting")), outcome)
            self.param_changes[key] = self.param_changes.get(key, 0) + 1

    def on_settings(self, row: dict) -> None:
        """A settings_history row: the run's live settings after a change (or at its start),
        whole (runtime/live_settings.py LiveSettings.history_row); W and S from its fields."""
        if row.get("policy") == "window":
            self.set_policy(row.get("window_tokens"), row.get("sink_tokens"))
        elif row.get("policy") == "unbounded":
            self.set_policy(None, None)
