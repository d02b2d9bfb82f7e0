"""The run loop: load → admission → engine → telemetry → control, one event heap per run.

Events (arrivals, session frames, ticks) sit in a heap ordered by their due time on the engine's
clock; the loop sleeps until the next one with `engine.sleep_until`, which is real time for vLLM
and simulated time for the twin, so one loop drives both. The loop dispatches only; the jobs
live in their own rooms:

    sessions.py   open, one frame (submit / skip / rollover), close, stall eviction
    record.py     each frame's outcome and latency, events, counters
    telemetry.py  per tick: pools, tokens, stall, ρ(t) and t_sat, overruns, the tick rows,
                  what placement and the memory guard weigh (one PoolMonitor per rank, pools.py)
    changes.py    live W/S/policy, target, limit and stall guard changes
    summary.py    the run row and the RunSummary (run_summary.py; JSON only in the store)

The loop never touches DuckDB or Streamlit itself: rows go to the store's writer queue.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import logging
import threading
import uuid

from control.admission import Gate, MemoryGuard, MemoryGuardConfig
from control.limits import make_limit
from control.nstar import NStarTracker
from control.placement import Placer
from engine.contract import Engine
from load_gen import arrival_times
from runtime.changes import LiveChanges
from runtime.config import RunConfig
from runtime.live_settings import LiveSettings, LiveState
from runtime.record import Recorder
from runtime.remote import ORIGIN
from runtime.run_summary import RunSummary
from runtime.sessions import Sessions
from runtime.trace_source import checked_trace
from runtime.inputs import input_summary
from runtime.summary import settle_store, summarise, write_run_end, write_run_start
from runtime.telemetry import EngineFailed, Telemetry
from store.archive_fs import checked_id

logger = logging.getLogger(__name__)

# At equal times: a scheduled change is requested first (so that tick applies it), then the
# tick samples the state the previous frames left, then arrivals and frames.
# Polls (remote clients: admission, opening, deltas) come last: they see the frames just sent.
_ORDER = {"change": 0, "tick": 1, "arrive": 2, "frame": 3, "poll": 4}
FINAL_FLUSH_TIMEOUT_S = 60.0

__all__ = ["EngineFailed", "Runner"]


class Runner:
    """Runs one experiment to completion (or stop) and records it in the store.

    `observers` receive every frame, tick and event row as well (`observe(table, row)`).
    `inlet` (runtime.remote.Inlet): clients from outside the process join as sessions."""

    def __init__(self, config: RunConfig, engine: Engine, store, run_id: str | None = None,
                 observers=(), inlet=None) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        # An id becomes an archive folder name one day: refuse what could not be one.
        self.run_id = (checked_id(run_id) if run_id is not None
                       else f"{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}")
        self._stop = threading.Event()
        self._stop_reason = "stopped by operator"
        self._thread: threading.Thread | None = None
        self.summary: RunSummary | None = None
        self.status = "created"
        self.progress = 0.0  # fraction of the planned duration done
        self._seq = itertools.count()
        self._heap: list = []
        self._frame_s = config.frame_s

        limit = make_limit(config.admission, config.budget, config.sessions, config.target)
        # The one owner of what the run is set to now: the gate and the control sampler read
        # the limit from it; live changes swap it (runtime/changes.py).
        self.live = LiveState(LiveSettings.at_start(config, limit, engine.policy))
        self.control = config.windowed_limit(self.live.limit)
        guard = MemoryGuard(MemoryGuardConfig()) if config.memory_guard else None
        self.gate = Gate(self.live.limit, guard)
        # N* from the same samples the limit sees; a cap at `sessions` is the offer's ceiling.
        self.n_star = NStarTracker(ceiling=max(config.sessions, 1))
        self.inlet = inlet
        self.recorder = Recorder(self.run_id, config, store.writer,
                                 (*observers, inlet) if inlet is not None else observers)
        # Built once: validating a load reads its folder or probes its device.
        load = config.load_config()
        trace = checked_trace(config)  # a replay's, read and checked before anything starts
        self._arrivals = arrival_times(load, trace)
        self.sessions = Sessions(config, engine, self.recorder, self.gate, self.control, load,
                                 trace)
        if inlet is not None:  # its clients are numbered after the planned arrivals
            inlet.attach(len(self._arrivals))
            self.sessions.inlet = inlet
        self.telemetry = Telemetry(config, engine, self.recorder)
        self.placer = Placer(config.placement)
        self.changes = LiveChanges(config, engine, self.recorder, self.live,
                                   on_policy=self.sessions.follow_policy)

    # --- live settings (read by the console) --------------------------------------------------
    @property
    def live_settings(self) -> LiveSettings:
        return self.live.now

    def apply(self, **change) -> str:
        """Change a setting live (from any thread); see LiveChanges.request."""
        if self.status != "running":
            raise ValueError(f"run {self.run_id} is {self.status}; nothing to change")
        return self.changes.request(**change)

    # --- lifecycle (from other threads) -------------------------------------------------------
    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name=f"metronome-run-{self.run_id}",
                                        daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, reason: str = "stopped by operator") -> None:
        self._stop_reason = reason
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self.status == "running"

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> RunSummary:
        cfg = self.config
        writer = self.store.writer
        self.status = "running"
        write_run_start(self.recorder, self.engine)
        self.changes.snapshot(0.0, "start", "start")
        lost_before = writer.health()["rows_lost"]
        storage_before = writer.storage_failures
        t0 = self.recorder.t0 = self.engine.now()
        status, reason = "finished", None
        writer.quiet.add(self.sessions.in_flight.wait_idle)  # its flushes wait for idle moments
        try:
            for i, t in enumerate(self._arrivals):
                self._push(t, "arrive", i)
            for change in cfg.changes:
                self._push(change.at_s, "change", change)
            self._push(0.0, "tick", 0)  # each tick pushes the next: the heap stays small
            if self.inlet is not None:
                self._push(0.0, "poll", 0)
            self.recorder.hold(True)  # an instant's rows go to the writer after its submits
            instant = 0.0
            while self._heap and not self._stop.is_set():
                t_rel, _, _, kind, payload = heapq.heappop(self._heap)
                if t_rel >= cfg.duration_s - 1e-9:
                    break  # the run is [0, duration): nothing starts at its end
                if t_rel > instant:
                    self.recorder.release()
                    instant = t_rel
                self.engine.sleep_until(t0 + t_rel)
                if kind == "tick":
                    self._on_tick(payload, t_rel)
                    self._push((payload + 1) * self._frame_s, "tick", payload + 1)
                elif kind == "change":
                    self._request_scheduled(payload, t_rel)
                elif kind == "arrive":
                    self._on_arrive(payload, t_rel)
                elif kind == "poll":
                    self.inlet.poll(self, t_rel)
                    self._push(t_rel + self.inlet.poll_s, "poll", 0)
                else:
                    next_at = self.sessions.on_frame(payload, t_rel)
                    if next_at is not None:
                        self._push(next_at, "frame", payload)
            if self._stop.is_set():
                status, reason = "aborted", self._stop_reason
            else:
                self.engine.sleep_until(t0 + cfg.duration_s)  # let the last deadlines pass
        except EngineFailed as exc:
            status, reason = "failed", f"engine failed: {exc}"
            logger.error("run %s failed: %s", self.run_id, reason)
        except Exception as exc:  # noqa: BLE001 - recorded, the data so far is kept
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            logger.exception("run %s failed", self.run_id)
        self.recorder.hold(False)
        writer.quiet.remove(self.sessions.in_flight.wait_idle)
        end_rel = self.engine.now() - t0
        if status == "finished":
            end_rel = min(end_rel, cfg.duration_s)
        self.changes.settle(end_rel)
        self.sessions.close_all(end_rel)
        if self.inlet is not None:
            self.inlet.finish()
        status, reason, store = settle_store(writer, self.run_id, status, reason, lost_before,
                                             storage_before, FINAL_FLUSH_TIMEOUT_S)
        self.summary = summarise(
            self.recorder, self.store.cursor(), self.engine, status=status, reason=reason,
            end_rel=end_rel, gate=self.gate,
            sessions_offered=len(self._arrivals) + (self.inlet.offered if self.inlet else 0),
            final_limit=self.gate.limit.limit, n_star=self.n_star.value,
            stall_at=self.telemetry.first_stall_at,  # a stalled rank is a stall
            opens_deferred=self.sessions.opens.deferred,
            ranks={**self.telemetry.summary(), "placement": cfg.placement},
            max_resident_blocks=self.sessions.max_resident_blocks(),
            settings=self.live.now.summary_values(), changes=self.changes.history,
            store=store, inputs=input_summary(self.engine, cfg.load, self.sessions.inputs_before,
                                              self.engine.input_stats()))
        write_run_end(self.recorder, self.summary)
        try:
            writer.flush(FINAL_FLUSH_TIMEOUT_S)
        except TimeoutError:
            logger.error("run %s: the end of the run is queued but not yet on disk", self.run_id)
        self.status = status
        self.progress = 1.0
        return self.summary

    def _request_scheduled(self, change, t_rel: float) -> None:
        """A `--change AT:KEY=VALUE` comes due: asked like the Controls page asks; a refusal
        is on the record (param_rejected), not the end of the run."""
        try:
            self.changes.request(**{change.key: change.value})
        except ValueError as exc:
            self.recorder.event(t_rel, "param_rejected", setting=change.key,
                                new=str(change.value), reason=str(exc))

    def _push(self, t_rel: float, kind: str, payload) -> None:
        # Equal times are ordered by _ORDER: a due change, then the tick, then arrivals, frames.
        heapq.heappush(self._heap, (round(t_rel, 9), _ORDER[kind], next(self._seq), kind,
                                    payload))

    def _on_arrive(self, session_id: int, t_rel: float) -> None:
        ticket, pin = self.admit(session_id, t_rel)
        if ticket is not None:
            self._push(self.sessions.open(session_id, ticket, t_rel, pin), "frame", session_id)

    def wake(self, session_id: int, t_rel: float) -> None:
        """A remote session's late audio came: its frame runs now (runtime.remote)."""
        self._push(t_rel, "frame", session_id)

    def open_remote(self, session_id: int, ticket, start: float, source, pin) -> None:
        """An admitted remote client's session, its frames from `start` (runtime.remote)."""
        at = self.sessions.open(session_id, ticket, start, pin, source, start, ORIGIN)
        self._push(at, "frame", session_id)

    def admit(self, session_id: int, t_rel: float, origin: str | None = None):
        """The gate's answer to one arrival: (Ticket or None, the rank to pin it to); a refusal
        is a `reject` event."""
        tel = self.telemetry
        rank, pin, live_here = 0, None, len(self.sessions.live)
        if tel.ranked:
            # The guard weighs the rank the session would land on; where the engine places,
            # that is the rank its balancer (fewest sessions) would pick.
            live = self.sessions.live_by_rank()
            rank = self.placer.choose(tel.loads(live), tel.growth_per_session_per_s(),
                                      tel.plateau_per_session(),
                                      kind=None if self.placer.pins else "count")
            pin = rank if self.placer.pins else None
            live_here = live.get(rank, 0)
        memory = tel.memory_signals(rank, t_rel, live_here)
        ticket = self.gate.acquire(memory)
        if ticket is None:
            self.recorder.event(t_rel, "reject", session_id=session_id,
                                reason=self.gate.last_rejection, limit=self.gate.limit.limit,
                                occupancy=round(memory.rho_now, 4),
                                rank=rank if tel.ranked else None,
                                origin=origin or self.config.load)
        return ticket, pin

    def _on_tick(self, k: int, t_rel: float) -> None:
        now = self.engine.now()
        tel = self.telemetry
        sample = tel.measure(t_rel, self.sessions.tick_counts(now))
        self.changes.apply_pending(t_rel)
        if self.live.now.stall_guard:
            # Only a stalled pool is stuck: evict on its rank (a fleet of one: anyone).
            for rank in tel.stalled_ranks():
                if self.sessions.evict_largest(t_rel, rank if tel.ranked else None):
                    tel.reset_stall(rank)
        live = len(self.sessions.live)
        if self.control.maybe_sample(now, live) and self.gate.limit.kind != "fixed":
            # A fixed cap is the operator's, not a controller's: it has no N*.
            self.n_star.add(t_rel, live, self.gate.limit.limit, self.control.last_p95_ms,
                            self.live.now.target * self.config.budget)
        n_star = self.n_star.value
        tel.write_tick(
            k, sample, live=live, live_by_rank=self.sessions.live_by_rank(),
            limit=self.gate.limit.limit, admitted=self.gate.admitted,
            rejected=sum(self.gate.rejected.values()), p95_ms=self.control.last_p95_ms,
            n_star=None if n_star is None else n_star.n_star)
        self.progress = min(1.0, t_rel / self.config.duration_s)
