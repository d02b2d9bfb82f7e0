"""MetricsExporter: an observer of the rows a run stores, and a Prometheus collector of them.

The runner calls `observe(table, row)` from its run thread for every row it hands to the store;
a scrape calls `collect()` from the HTTP server's thread. Both hold one lock only long enough to
update or copy plain numbers, so a scrape never waits on the run and the run never waits on a
scrape's text formatting.

Every run's series carry `run_id`, `engine` and `model` labels, so two runs in one process (the
console runs one after another, experiments run series) never share or reset a series. Gauges
are exported only while their run is active: a finished run's pool is gone, and a stale "pool
full" would keep alerts firing. Counters and histograms of the last few finished runs stay so
the last scrape sees their final counts; older runs are dropped to keep memory flat.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.registry import Collector

from metrics.run_state import FRAME_OUTCOMES, RunState

logger = logging.getLogger(__name__)

RUN_LABELS = ("run_id", "engine", "model")
RETAINED_ENDED_RUNS = 8


class MetricsExporter(Collector):
    """See the module docstring. Thread-safe; one per process is enough (see
    metrics.default_exporter), more are fine on separate registries."""

    def __init__(self, retained_ended_runs: int = RETAINED_ENDED_RUNS) -> None:
        if not 0 <= retained_ended_runs <= 1000:
            raise ValueError(f"retained ended runs {retained_ended_runs} must be in [0, 1000]")
        self.retained_ended_runs = retained_ended_runs
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, RunState] = OrderedDict()
        # Store writers whose lost rows are exported; weak so a closed store can go away.
        self._writers: weakref.WeakSet = weakref.WeakSet()
        self._drift_reader = None  # see track_drift

    # --- from the run's side ------------------------------------------------------------------
    def run_started(self, run_id: str, engine: str, model: str, *, budget_ms: float | None = None,
                    window_tokens: int | None = None, sink_tokens: int | None = None,
                    policy: str | None = None) -> None:
        """Name a run's engine and model before its rows arrive (rows alone name the engine
        only). `policy` "unbounded" or "window" with its W and S seeds the KV gauges."""
        if not run_id:
            raise ValueError("run id must be a non-empty string")
        if budget_ms is not None and not budget_ms > 0:
            raise ValueError(f"budget {budget_ms} ms must be > 0")
        with self._lock:
            state = self._state(run_id)
            state.engine, state.model, state.active = str(engine), str(model), True
            if budget_ms is not None:
                state.budget_s = budget_ms / 1e3
            if policy is not None:
                state.set_policy(window_tokens if policy == "window" else None, sink_tokens)

    def run_started_for(self, run_id: str, config) -> None:
        """run_started with what a RunConfig says (engine, model, budget, KV policy)."""
        self.run_started(run_id, config.engine, config.model, budget_ms=config.budget,
                         policy=config.policy, window_tokens=config.window,
                         sink_tokens=config.sinks)

    def run_ended(self, run_id: str, summary: dict | None = None) -> None:
        """The run is over (also inferred from its `end` event): its gauges leave the scrape."""
        with self._lock:
            state = self._runs.get(run_id)
            if state is not None:
                state.active = False
                self._prune()

    def observe(self, table: str, row: dict) -> None:
        """One row the runner stored. Unknown tables (steps, runs) are ignored."""
        if table not in ("frames", "ticks", "events", "rank_ticks", "settings_history"):
            return
        run_id = row.get("run_id")
        if not run_id:
            return
        with self._lock:
            state = self._state(run_id)
            if table == "frames":
                state.on_frame(row)
            elif table == "ticks":
                state.on_tick(row)
            elif table == "rank_ticks":
                state.on_rank_tick(row)
            elif table == "settings_history":
                state.on_settings(row)
            else:
                state.on_event(row)
                if not state.active:
                    self._prune()

    def track_drift(self, read) -> None:
        """Export the scheduled canaries' drift at every scrape: `read()` returns
        store.schedules.latest_drift rows (called from the scrape's thread: give it a reader
        that opens its own cursor)."""
        with self._lock:
            self._drift_reader = read

    def track_store(self, writer) -> None:
        """Export the writer's lost and written rows (`health()`) at every scrape."""
        with self._lock:
            self._writers.add(writer)

    def _state(self, run_id: str) -> RunState:
        state = self._runs.get(run_id)
        if state is None:
            state = self._runs[run_id] = RunState(run_id)
        return state

    def _prune(self) -> None:
        ended = [rid for rid, s in self._runs.items() if not s.active]
        for run_id in ended[:max(0, len(ended) - self.retained_ended_runs)]:
            del self._runs[run_id]

    # --- from the scrape's side ---------------------------------------------------------------
    def describe(self):
        # Names only (no samples): lets a registry refuse a second collector of the same names.
        return [f for f in self._families([], 0, 0) + _drift_families(None)]

    def collect(self):
        with self._lock:
            snapshot = [_copy(s) for s in self._runs.values()]
            writers = list(self._writers)
            read_drift = self._drift_reader
        # StoreWriter.health(): rows lost per table (and why), rows written.
        health = [w.health() for w in writers]
        lost = sum(sum(h["rows_lost"].values()) for h in health)
        written = sum(h["rows_written"] for h in health)
        return self._families(snapshot, lost, written) + _drift_families(read_drift)

    def _families(self, runs: list[dict], rows_lost: int, rows_written: int) -> list:
        labels = list(RUN_LABELS)

        def gauge(name, doc, extra=()):
            return GaugeMetricFamily(name, doc, labels=labels + list(extra))

        def counter(name, doc, extra=()):
            return CounterMetricFamily(name, doc, labels=labels + list(extra))

        latency = HistogramMetricFamily(
            "metronome_frame_latency_seconds",
            "Frame latency from submit to last token; censored frames (latency unknown or a "
            "lower bound) are not observed, see metronome_frames_censored_total.",
            labels=labels)
        overrun = HistogramMetricFamily(
            "metronome_tick_overrun_seconds",
            "How late each tick ran against its due time (0 when on time).", labels=labels)
        frames = counter("metronome_frames", "Frames finalised, by outcome (silent: no token "
                         "by the deadline; late: tokens but not complete by it).", ["outcome"])
        censored = counter("metronome_frames_censored",
                           "Frames whose latency is unknown or only a lower bound.")
        budget = gauge("metronome_frame_budget_seconds", "The run's frame deadline budget.")
        occupancy = gauge("metronome_pool_occupancy_ratio",
                          "KV block pool occupancy, used / total blocks (1: full).")
        blocks = gauge("metronome_pool_blocks", "KV pool blocks by state.", ["state"])
        tsat = gauge("metronome_tsat_seconds", "Predicted seconds until the KV pool is full at "
                     "the fitted growth; +Inf when occupancy is not rising (e.g. bounded KV).")
        live = gauge("metronome_sessions_live", "Sessions admitted and open.")
        limit = gauge("metronome_admission_limit", "The admission limit on live sessions.")
        n_star = gauge("metronome_n_star_sessions", "N*: the live sessions the admission "
                       "controller held at the latency target over its last stable stretch "
                       "(absent until there is one).")
        waiting = gauge("metronome_frames_waiting",
                        "Sessions whose in-flight frame the engine still owes.")
        stalled = gauge("metronome_stalled",
                        "1 while the pool is stalled (full, frames owed, no token out).")
        requests = gauge("metronome_engine_requests",
                         "Engine requests by scheduler state, as the run saw them.", ["state"])
        decisions = counter("metronome_admission_decisions",
                            "Admission decisions on arriving sessions.", ["decision", "reason"])
        evictions = counter("metronome_evictions", "Sessions evicted, by reason.", ["reason"])
        closes = counter("metronome_sessions_closed",
                         "Sessions closed early (not by their own end), by reason.", ["reason"])
        stalls = counter("metronome_stalls", "Stalls that began (the pool stopped serving).")
        rollovers = counter("metronome_rollovers",
                            "Sessions reopened with their last W tokens before max_model_len.")
        params = counter("metronome_param_changes", "Live setting changes, applied or rejected.",
                         ["setting", "outcome"])
        window = gauge("metronome_kv_window_tokens",
                       "Per-session KV window W in tokens; +Inf when KV is unbounded.")
        sinks = gauge("metronome_kv_sink_tokens", "Attention-sink tokens S kept per session.")
        # Data parallelism: what a session-sticky router (Ray Serve LLM, llm-d) needs per rank
        # to place a new session where the pool fills last.
        rank_occupancy = gauge("metronome_rank_pool_occupancy_ratio",
                               "KV pool occupancy of one data-parallel rank.", ["rank"])
        rank_tsat = gauge("metronome_rank_tsat_seconds", "Predicted seconds until this rank's "
                          "pool is full; +Inf when it is not rising.", ["rank"])
        rank_stalled = gauge("metronome_rank_stalled",
                             "1 while this rank's pool is stalled.", ["rank"])
        rank_live = gauge("metronome_rank_sessions_live", "Sessions living on this rank.",
                          ["rank"])
        causes = counter("metronome_silent_frames",
                         "Silent frames by cause: memory (pool full), compute (room in the pool, "
                         "steps too slow), guard (evicted), other (session error).", ["cause"])
        rank_silent = counter("metronome_rank_silent_frames",
                              "Silent frames of the sessions on this rank.", ["rank"])
        active = gauge("metronome_run_active", "1 while the run runs, 0 once it ended "
                       "(ended runs are kept for a few scrapes).")
        lost = CounterMetricFamily(
            "metronome_store_rows_lost",
            "Rows the DuckDB writer could not store (the console and reports miss them).")
        lost.add_metric([], rows_lost)
        written = CounterMetricFamily("metronome_store_rows_written",
                                      "Rows the DuckDB writer stored.")
        written.add_metric([], rows_written)

        for s in runs:
            key = [s["run_id"], s["engine"], s["model"]]
            latency.add_metric(key, s["latency"], s["latency_sum"])
            overrun.add_metric(key, s["overrun"], s["overrun_sum"])
            for outcome in FRAME_OUTCOMES:
                frames.add_metric(key + [outcome], s["frames"][outcome])
            censored.add_metric(key, s["censored"])
            decisions.add_metric(key + ["admitted", "admitted"], s["admitted"])
            for reason, n in sorted(s["rejected"].items()):
                decisions.add_metric(key + ["rejected", reason], n)
            for reason, n in sorted(s["evictions"].items()):
                evictions.add_metric(key + [reason], n)
            for reason, n in sorted(s["closes"].items()):
                closes.add_metric(key + [reason], n)
            for (setting, outcome), n in sorted(s["param_changes"].items()):
                params.add_metric(key + [setting, outcome], n)
            stalls.add_metric(key, s["stalls"])
            for cause, n in sorted(s["silent_causes"].items()):
                causes.add_metric(key + [cause], n)
            for rank, n in sorted(s["rank_silent"].items()):
                rank_silent.add_metric(key + [rank], n)
            rollovers.add_metric(key, s["rollovers"])
            active.add_metric(key, 1.0 if s["active"] else 0.0)
            if not s["active"]:
                continue
            if s["budget_s"] is not None:
                budget.add_metric(key, s["budget_s"])
            if s["window_tokens"] is not None:
                window.add_metric(key, s["window_tokens"])
                sinks.add_metric(key, s["sink_tokens"])
            g = s["gauges"]
            if not g:
                continue  # no tick yet
            for family, name in ((occupancy, "occupancy"), (tsat, "tsat_s"), (live, "live"),
                                 (limit, "limit"), (waiting, "frames_waiting"),
                                 (stalled, "stalled"), (n_star, "n_star")):
                if g.get(name) is not None:
                    family.add_metric(key, float(g[name]))
            for state, name in (("used", "used_blocks"), ("free", "free_blocks")):
                if g.get(name) is not None:
                    blocks.add_metric(key + [state], float(g[name]))
            for state in ("running", "waiting"):
                if g.get(state) is not None:
                    requests.add_metric(key + [state], float(g[state]))
            for rank, rg in sorted(s["rank_gauges"].items()):
                for family, name in ((rank_occupancy, "occupancy"), (rank_tsat, "tsat_s"),
                                     (rank_stalled, "stalled"), (rank_live, "live")):
                    if rg.get(name) is not None:
                        family.add_metric(key + [rank], float(rg[name]))
        return [latency, frames, censored, budget, occupancy, blocks, tsat, live, limit, n_star,
                waiting, stalled, requests, decisions, evictions, closes, stalls, rollovers, params,
                window, sinks, overrun, active, lost, written, rank_occupancy, rank_tsat,
                rank_stalled, rank_live, rank_silent, causes]


def _drift_families(read) -> list:
    """Scheduled canaries: per schedule, whether its last fire drifted past its threshold and
    the relative change of N* and t_sat since the fire before."""
    drifted = GaugeMetricFamily("metronome_schedule_drifted", "1 when the schedule's last fire "
                                "moved N* or t_sat past its drift threshold.", labels=["schedule"])
    n_star = GaugeMetricFamily("metronome_schedule_n_star_change_ratio", "Relative change of "
                               "N* at the schedule's last fire (+0.25: 25 % up).",
                               labels=["schedule"])
    t_sat = GaugeMetricFamily("metronome_schedule_t_sat_change_ratio", "Relative change of "
                              "t_sat at the schedule's last fire.", labels=["schedule"])
    if read is not None:
        try:
            rows = read().to_dict("records")
        except Exception:  # noqa: BLE001 - a scrape must not fail on the store
            logger.exception("reading schedule drift for the metrics failed")
            rows = []
        for row in rows:
            name = [str(row["name"])]
            drifted.add_metric(name, 1.0 if row["drifted"] else 0.0)
            for family, column in ((n_star, "n_star_change"), (t_sat, "t_sat_change")):
                value = row.get(column)
                if value is not None and value == value:  # NaN: not measured
                    family.add_metric(name, float(value))
    return [drifted, n_star, t_sat]


def _copy(s: RunState) -> dict:
    """The numbers a scrape needs, copied under the lock (lists and dicts are new objects)."""
    return {"run_id": s.run_id, "engine": s.engine, "model": s.model, "active": s.active,
            "budget_s": s.budget_s, "latency": s.latency.cumulative(),
            "latency_sum": s.latency.total, "overrun": s.overrun.cumulative(),
            "overrun_sum": s.overrun.total, "frames": dict(s.frames), "censored": s.censored,
            "admitted": s.admitted, "rejected": dict(s.rejected),
            "evictions": dict(s.evictions), "closes": dict(s.closes),
            "param_changes": dict(s.param_changes), "stalls": s.stalls,
            "rollovers": s.rollovers, "window_tokens": s.window_tokens,
            "sink_tokens": s.sink_tokens, "gauges": dict(s.gauges),
            "rank_gauges": {r: dict(g) for r, g in s.rank_gauges.items()},
            "rank_silent": dict(s.rank_silent), "silent_causes": dict(s.silent_causes)}
