"""The runtime: load → admission → engine → telemetry → control, one event loop per run.

Events (arrivals, session frames, ticks) sit in a heap ordered by their due time on the engine's
clock; the loop sleeps until the next one with `engine.sleep_until`, which is real time for vLLM
and simulated time for the twin, so one loop drives both. The loop never touches DuckDB or
Streamlit itself: rows go to the store's writer queue.

A frame's record is finalised at its session's next frame time (or at close): by then its
deadline has passed, so `tokens_by(deadline)` says whether it was silent.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import json
import logging
import math
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field

from control.admission import Gate, MemoryGuard, MemoryGuardConfig
from control.limits import (AIMDConfig, AIMDLimit, FixedLimit, GradientConfig, GradientLimit,
                            WindowedLimit)
from control.signals import OccupancyTracker, StallDetector, fit_occupancy, predict_t_sat
from engine.contract import KVPolicy
from engine.contract import Engine, FrameHandle
from load_gen import arrival_times, make_frame_source
from runtime.config import RunConfig
from store import queries

logger = logging.getLogger(__name__)

_ORDER = {"tick": 0, "arrive": 1, "frame": 2}
STALL_TICKS = 2  # ticks with a full pool, frames owed and no token out: a stall


class EngineFailed(RuntimeError):
    pass


@dataclass
class _Session:
    session_id: int
    start: float  # run-relative seconds of its first frame
    end: float
    frames: object  # a load_gen frame source
    history: deque  # last W input tokens (rollover prompt); bounded
    kv_tokens: int = 0  # tokens the engine holds for it (grows by in + out − 1 per frame)
    frame_idx: int = 0
    inflight: FrameHandle | None = None
    record: tuple | None = None  # (frame_idx, handle) awaiting finalisation
    tokens_seen: int = 0  # tokens of the in-flight handle already counted in a tick
    max_blocks: int = 0


@dataclass
class _Totals:
    frames: int = 0
    silent: int = 0
    on_time: int = 0
    naive_on_time: int = 0
    evicted: int = 0
    rollovers: int = 0
    overruns: int = 0
    max_overrun_ms: float = 0.0
    max_occupancy: float = 0.0


class Runner:
    """Runs one experiment to completion (or stop) and records it in the store."""

    def __init__(self, config: RunConfig, engine: Engine, store, run_id: str | None = None,
                 observers: list | tuple = ()):
        self.config = config
        self.engine = engine
        self.store = store
        # Each gets observe(table, row) for every frame, tick and event row stored (metrics).
        self.observers = tuple(observers)
        self.run_id = run_id or f"{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()
        self._stop_reason = "stopped by operator"
        self._thread: threading.Thread | None = None
        self.summary: dict | None = None
        self.status = "created"
        self.progress = 0.0  # fraction of the planned duration done
        self._seq = itertools.count()
        self._heap: list = []
        self._sessions: dict[int, _Session] = {}
        self._totals = _Totals()
        self._budget_s = config.budget / 1e3
        self._frame_s = config.frame_ms / 1e3
        self._stall = StallDetector(STALL_TICKS)
        self._first_stall_at: float | None = None  # survives the stall guard's detector reset
        self._max_blocks_closed = 0
        self._tokens_unticked = 0  # tokens of replaced in-flight frames, for the next tick
        self._tick_frames = 0  # frames finalised since the last tick (silent rate per tick)
        self._tick_silent = 0
        self.limit = self._make_limit(config.admission)
        self.control = WindowedLimit(self.limit, config.control_interval_s,
                                     min_samples=5)
        guard = MemoryGuard(MemoryGuardConfig()) if config.memory_guard == "on" else None
        self.gate = Gate(self.limit, guard)
        # Built once: validating a load reads its folder or probes its device.
        self._load = config.load_config()
        self._arrivals = arrival_times(self._load)
        self._occupancy = OccupancyTracker(window_s=max(2.0, 10 * self._frame_s))
        self._changes: list[tuple[str, object]] = []  # live changes, applied at the next tick
        self._changes_lock = threading.Lock()
        self.stall_guard = config.stall_guard  # live setting ("on"/"off")
        self.target = config.target  # live latency target, a fraction of the budget

    def _make_limit(self, kind: str, **overrides):
        cfg = self.config
        cap = max(cfg.sessions, 1)
        if kind == "aimd":
            params = {"initial": min(4, cap), "max_limit": cap,
                      "target_fraction": getattr(self, "target", cfg.target)}
            return AIMDLimit(AIMDConfig(**{**params, **overrides}), cfg.budget)
        if kind == "gradient":
            params = {"initial": min(4, cap), "max_limit": cap,
                      "target_fraction": getattr(self, "target", cfg.target)}
            return GradientLimit(GradientConfig(**{**params, **overrides}), cfg.budget)
        if kind in ("off", "fixed"):
            return FixedLimit(int(overrides.get("limit", cap)))
        raise ValueError(f"limit {kind!r} is not one of off, fixed, aimd, gradient")

    # --- control from other threads -----------------------------------------------------------
    def apply(self, **change) -> str:
        """Change a setting live (from any thread). Validates now, raises ValueError with a
        one-line reason; applies at the next tick in the run thread, where it is recorded as a
        `param_change` event. Returns the confirmation to show the operator.

        Keys: window, sinks, policy (the KV policy); target (fraction of the budget);
        limit ("fixed" | "aimd" | "gradient") with limit_params (dict); stall_guard ("on"/"off").
        """
        if self.status != "running":
            raise ValueError(f"run {self.run_id} is {self.status}; nothing to change")
        unknown = sorted(set(change) - {"window", "sinks", "policy", "target", "limit",
                                        "limit_params", "stall_guard"})
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
        done = []
        if {"window", "sinks", "policy"} & set(change):
            old = self.engine.policy
            policy = KVPolicy(change.get("policy", old.kind),
                              change.get("window", old.window_tokens),
                              change.get("sinks", old.sink_tokens))
            policy.check_block_size(self.config.block_size)
            refusal = self.engine.policy_change_refusal(policy)
            if refusal:
                raise ValueError(refusal)
            self._queue_change("policy", policy)
            done.append(f"KV policy {self._policy_text(old)} → {self._policy_text(policy)}")
        if "target" in change:
            target = float(change["target"])
            if not 0 < target <= 1:
                raise ValueError(f"target {target} must be in (0, 1] of the budget")
            self._queue_change("target", target)
            done.append(f"latency target {target:.2f}·budget")
        if "limit" in change:
            limit = self._make_limit(change["limit"], **change.get("limit_params", {}))
            self._queue_change("limit", limit)
            done.append(f"limit {change['limit']} (cap {limit.limit})")
        if "stall_guard" in change:
            if change["stall_guard"] not in ("on", "off"):
                raise ValueError(f"stall guard {change['stall_guard']!r} is not one of on, off")
            self._queue_change("stall_guard", change["stall_guard"])
            done.append(f"stall guard {change['stall_guard']}")
        return "applied at the next tick: " + "; ".join(done)

    @staticmethod
    def _policy_text(policy: KVPolicy) -> str:
        if policy.kind == "unbounded":
            return "unbounded"
        return f"window W={policy.window_tokens} S={policy.sink_tokens}"

    def _queue_change(self, key: str, value) -> None:
        with self._changes_lock:
            self._changes.append((key, value))

    def _apply_changes(self, t_rel: float) -> None:
        with self._changes_lock:
            changes, self._changes = self._changes, []
        for key, value in changes:
            if key == "policy":
                old = self.engine.policy
                try:
                    applied = self.engine.set_policy(value)
                    reason = "the engine refused it"
                except (ValueError, RuntimeError, TimeoutError) as exc:
                    applied, reason = False, f"{type(exc).__name__}: {exc}"
                if not applied:  # the run goes on with the old policy; the operator sees why
                    logger.warning("KV policy change to %s failed: %s",
                                   self._policy_text(value), reason)
                    self._event(t_rel, "param_rejected", setting=key,
                                new=self._policy_text(value), reason=reason)
                    continue
                detail = {"old": self._policy_text(old), "new": self._policy_text(value)}
                for session in self._sessions.values():  # rollover prompts follow the new W
                    session.history = deque(session.history, maxlen=self._history_tokens())
            elif key == "target":
                # Kept even under a fixed limit: a later AIMD/gradient limit starts from it.
                detail = {"old": self.target, "new": value}
                self.target = value
                if hasattr(self.limit, "retarget"):
                    self.limit.retarget(value)
            elif key == "limit":
                detail = {"old": getattr(self.limit, "kind", "?"), "new": value.kind,
                          "cap": value.limit}
                self.limit = value
                self.gate.limit = value
                self.control.inner = value
            else:
                detail = {"old": self.stall_guard, "new": value}
                self.stall_guard = value
            self._event(t_rel, "param_change", setting=key, **detail)

    # --- control from other threads (run lifecycle) --------------------------------------------
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
    def run(self) -> dict:
        cfg = self.config
        writer = self.store.writer
        self.status = "running"
        self._write_run_start()
        self._t0 = self.engine.now()
        status, reason = "finished", None
        try:
            for i, t in enumerate(self._arrivals):
                self._push(t, "arrive", i)
            n_ticks = int(math.ceil(cfg.duration_s / self._frame_s - 1e-9))
            for k in range(n_ticks):
                self._push(k * self._frame_s, "tick", k)
            while self._heap and not self._stop.is_set():
                t_rel, _, _, kind, payload = heapq.heappop(self._heap)
                if t_rel >= cfg.duration_s - 1e-9:
                    break  # the run is [0, duration): nothing starts at its end
                self.engine.sleep_until(self._t0 + t_rel)
                if kind == "tick":
                    self._on_tick(payload, t_rel)
                elif kind == "arrive":
                    self._on_arrive(payload, t_rel)
                elif kind == "frame":
                    self._on_frame(payload, t_rel)
            if self._stop.is_set():
                status, reason = "aborted", self._stop_reason
            else:
                self.engine.sleep_until(self._t0 + cfg.duration_s)  # let the last deadlines pass
        except EngineFailed as exc:
            status, reason = "failed", f"engine failed: {exc}"
            logger.error("run %s failed: %s", self.run_id, reason)
        except Exception as exc:  # noqa: BLE001 - recorded, the data so far is kept
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            logger.exception("run %s failed", self.run_id)
        end_rel = min(self.engine.now() - self._t0, cfg.duration_s) if status == "finished" \
            else self.engine.now() - self._t0
        self._close_all(end_rel)
        writer.flush()
        self.summary = self._summarise(status, reason, end_rel)
        self._write_run_end(status, reason)
        writer.flush()
        self.status = status
        self.progress = 1.0
        return self.summary

    def _rejected(self) -> int:
        return sum(self.gate.rejected.values())

    def _push(self, t_rel: float, kind: str, payload) -> None:
        # At equal times a tick comes first: it samples the state the previous frames left.
        heapq.heappush(self._heap, (round(t_rel, 9), _ORDER[kind], next(self._seq), kind,
                                    payload))

    def _event(self, t_rel: float, kind: str, **detail) -> None:
        self._record("events", {
            "run_id": self.run_id, "t": t_rel, "wall_at": dt.datetime.now(), "kind": kind,
            "detail": json.dumps(detail, default=str)})

    def _record(self, table: str, row: dict) -> None:
        """Queue a row for the store and show it to the observers. A failing observer is logged
        once and dropped: metrics must neither end an experiment nor flood its log."""
        self.store.writer.add(table, row)
        for observer in self.observers:
            try:
                observer.observe(table, row)
            except Exception:  # noqa: BLE001
                logger.exception("observer %r failed on a %s row; dropped", observer, table)
                self.observers = tuple(o for o in self.observers if o is not observer)

    # --- arrivals and frames ------------------------------------------------------------------
    def _on_arrive(self, session_id: int, t_rel: float) -> None:
        cfg = self.config
        reason = self.gate.acquire(self._memory_signals(t_rel))
        if reason is not None:
            self._event(t_rel, "reject", session_id=session_id, reason=reason,
                        limit=self.limit.limit, occupancy=round(self._occupancy.rho_now, 4))
            return
        if cfg.stagger:
            start = t_rel + (session_id % 8) / 8 * self._frame_s if cfg.load == "fixed" else t_rel
        else:
            start = math.ceil(t_rel / self._frame_s - 1e-9) * self._frame_s  # next tick
        end = start + cfg.session_s if cfg.session_s else math.inf
        window = self._history_tokens()
        source = make_frame_source(self._load, session_id, self.engine.vocab_size,
                                   cfg.tokens_in)
        session = _Session(session_id, start, end, source, deque(maxlen=window))
        self.engine.open(session_id)
        self._sessions[session_id] = session
        self._push(start, "frame", session_id)

    def _memory_signals(self, t_rel: float) -> dict:
        """What the memory guard weighs: ρ now, growth per session (fitted, or from the load's
        token rate before there is a fit), the bounded share per session, the lifetime."""
        cfg = self.config
        pool_tokens = cfg.pool_blocks * cfg.block_size
        live = len(self._sessions)
        # The load's own token rate is a floor: an early fit over a window that still holds
        # the empty pool underestimates the slope, and under-estimating is what stalls.
        growth = (cfg.tokens_in + cfg.tokens_out - 1) / self._frame_s / pool_tokens
        fit = self._occupancy.fit()
        if fit is not None and live > 0:
            growth = max(growth, fit.slope_per_s / live)
        cap = self.engine.policy.blocks_per_session(cfg.block_size)
        plateau = None if cap is None else cap / cfg.pool_blocks
        lifetime = cfg.session_s if cfg.session_s else max(0.0, cfg.duration_s - t_rel)
        return {"rho_now": self._occupancy.rho_now, "growth_per_session_per_s": growth,
                "plateau_per_session": plateau, "lifetime_s": lifetime}

    def _on_frame(self, session_id: int, t_rel: float) -> None:
        cfg = self.config
        session = self._sessions.get(session_id)
        if session is None:
            return
        now = self.engine.now()
        failed = session.inflight is not None and session.inflight.error not in (None, "closed")
        self._finalise(session, now)
        if failed:
            # One session's error ends that session only; the engine-wide case is caught at
            # the tick (engine.error()) and fails the run.
            self._close_session(session, t_rel, f"session error: {session.inflight.error}")
            return
        if t_rel >= session.end - 1e-9:
            self._close_session(session, t_rel, "session ended")
            return
        # The source advances every period, served or not: speech does not wait for the engine.
        frame = session.frames.next_frame(self._frame_s)
        if frame is None:
            self._close_session(session, t_rel, "source ended")
            return
        idx = session.frame_idx
        session.frame_idx += 1
        # From the start time, not by adding periods: no drift against the tick grid.
        self._push(session.start + session.frame_idx * self._frame_s, "frame", session_id)
        if session.inflight is not None and not session.inflight.done_by(now):
            # The engine still owes the previous frame: this one cannot even be submitted.
            self._write_frame(session, idx, t_rel, None, now)
            return
        tokens = frame.token_ids
        prompt = tokens
        if session.kv_tokens + len(tokens) + cfg.tokens_out >= self._max_model_len():
            if not self._rollover(session, t_rel):
                return
            prompt = list(session.history) + tokens
        session.history.extend(tokens)
        self._tokens_unticked += self._new_tokens(session)
        handle = self.engine.submit(session_id, prompt, cfg.tokens_out)
        session.kv_tokens += len(prompt) + cfg.tokens_out - 1
        session.max_blocks = max(session.max_blocks, self._resident_blocks(session.kv_tokens))
        session.inflight, session.record, session.tokens_seen = handle, (idx, handle), 0

    @staticmethod
    def _new_tokens(session: _Session) -> int:
        """Tokens of the session's in-flight frame not yet counted by a tick."""
        if session.inflight is None:
            return 0
        n = len(session.inflight.token_times)
        new, session.tokens_seen = n - session.tokens_seen, n
        return new

    def _history_tokens(self) -> int:
        """Input tokens a session keeps on the host for its rollover prompt: the live W."""
        policy = self.engine.policy
        return policy.window_tokens if policy.kind == "window" else self.config.tokens_in

    def _max_model_len(self) -> int:
        return int(getattr(self.engine, "max_model_len", 1 << 30))

    def _resident_blocks(self, kv_tokens: int) -> int:
        bs = self.config.block_size
        cap = self.engine.policy.blocks_per_session(bs)
        blocks = math.ceil(kv_tokens / bs)
        return blocks if cap is None else min(blocks, cap)

    def _rollover(self, session: _Session, t_rel: float) -> bool:
        """Before a session reaches max_model_len: reopen it with its last W tokens (window),
        or end it (unbounded has nothing to keep). Returns False when the session ended."""
        if self.engine.policy.kind != "window":
            self._close_session(session, t_rel, "max_model_len")
            return False
        self.engine.close(session.session_id)
        self.engine.open(session.session_id)
        session.kv_tokens = 0
        session.inflight = None
        self._totals.rollovers += 1
        self._event(t_rel, "rollover", session_id=session.session_id,
                    prompt_tokens=len(session.history))
        return True

    def _finalise(self, session: _Session, now: float, keep_early: bool = True) -> None:
        if session.record is None:
            return
        idx, handle = session.record
        session.record = None
        if not keep_early and now < handle.t_submit + self._budget_s:
            return  # cut off by the run's end before its deadline: neither late nor silent
        self._write_frame(session, idx, handle.t_submit - self._t0, handle, now)

    def _write_frame(self, session: _Session, idx: int, t_sub_rel: float,
                     handle: FrameHandle | None, now: float) -> None:
        cfg = self.config
        tot = self._totals
        budget_s = self._budget_s
        row = {"run_id": self.run_id, "session_id": session.session_id, "frame_idx": idx,
               "t_submit": t_sub_rel, "deadline": t_sub_rel + budget_s,
               "tokens_expected": cfg.tokens_out, "skipped": handle is None}
        if handle is None:
            # Never submitted, never answered: its latency is at least the budget (a censored
            # lower bound, complete = false), and a gateway with a wait budget answers empty.
            latency_ms = cfg.budget
            naive_ms = cfg.wait_budget * cfg.budget if cfg.wait_budget else latency_ms
            row.update(t_first=None, t_done=None, latency_ms=latency_ms, tokens_out=0,
                       on_time=False, silent=True, complete=False, naive_latency_ms=naive_ms,
                       naive_on_time=cfg.wait_budget is not None)
        else:
            deadline = handle.t_submit + budget_s
            complete = handle.done_by(now) and handle.error is None
            n_out = handle.tokens_by(deadline)
            latency_ms = ((handle.t_done if complete else now) - handle.t_submit) * 1e3
            on_time = complete and handle.t_done <= deadline
            if cfg.wait_budget:
                naive_ms = min(latency_ms, cfg.wait_budget * cfg.budget)
            else:
                naive_ms = latency_ms
            t_first = handle.t_first
            row.update(
                t_first=None if t_first is None else t_first - self._t0,
                t_done=handle.t_done - self._t0 if complete else None,
                latency_ms=latency_ms, naive_latency_ms=naive_ms, tokens_out=n_out,
                on_time=on_time, naive_on_time=naive_ms <= cfg.budget + 1e-9,
                silent=n_out == 0, complete=complete)
        tot.frames += 1
        tot.silent += row["silent"]
        tot.on_time += row["on_time"]
        tot.naive_on_time += bool(row["naive_on_time"])
        self.control.add(now, row["latency_ms"], row["silent"])
        self._tick_frames += 1
        self._tick_silent += row["silent"]
        self._record("frames", row)

    def _close_session(self, session: _Session, t_rel: float, why: str) -> None:
        self._finalise(session, self.engine.now(), keep_early=why != "run ended")
        close_source = getattr(session.frames, "close", None)
        if close_source is not None:
            close_source()  # e.g. releases a microphone stream now, not at garbage collection
        self.engine.close(session.session_id)
        self._sessions.pop(session.session_id, None)
        self._max_blocks_closed = max(self._max_blocks_closed, session.max_blocks)
        self.gate.release()
        if why not in ("session ended", "run ended", "source ended"):
            self._event(t_rel, "close", session_id=session.session_id, reason=why)

    def _close_all(self, t_rel: float) -> None:
        for session in list(self._sessions.values()):
            try:
                self._close_session(session, t_rel, "run ended")
            except Exception:  # noqa: BLE001 - keep closing the others
                logger.exception("closing session %s", session.session_id)

    # --- per tick: telemetry, stall, control --------------------------------------------------
    def _on_tick(self, k: int, t_rel: float) -> None:
        cfg = self.config
        tot = self._totals
        now = self.engine.now()
        # A paced twin keeps virtual time exact; its lag behind the wall clock is the overrun.
        lag_s = max(now - self._t0 - t_rel, getattr(self.engine, "wall_lag_s", 0.0))
        overrun_ms = max(0.0, lag_s * 1e3)
        if overrun_ms > cfg.frame_ms / 2:
            tot.overruns += 1
        tot.max_overrun_ms = max(tot.max_overrun_ms, overrun_ms)
        if self.engine.error():
            raise EngineFailed(self.engine.error())
        tokens_tick, self._tokens_unticked = self._tokens_unticked, 0
        waiting = 0
        for session in self._sessions.values():
            tokens_tick += self._new_tokens(session)
            handle = session.inflight
            # Owed: submitted at least half a frame ago and not done (a frame submitted just
            # now is not late yet).
            if handle is not None and not handle.done_by(now) \
                    and handle.t_submit <= now - self._frame_s / 2:
                waiting += 1
        pool = self.engine.pool()
        stalled = self._stall.update(t_rel, tokens_tick, waiting, pool.occupancy)
        if stalled and self._first_stall_at is None:
            self._first_stall_at = self._stall.stall_at
        tot.max_occupancy = max(tot.max_occupancy, pool.occupancy)
        self._apply_changes(t_rel)
        if stalled and self.stall_guard == "on":
            self._evict_for_stall(t_rel)
        self._occupancy.add(t_rel, pool.occupancy)
        self.control.maybe_sample(now, len(self._sessions))
        silent_rate = self._tick_silent / self._tick_frames if self._tick_frames else None
        self._tick_frames = self._tick_silent = 0
        fit = self._occupancy.fit()
        self._record("ticks", {
            "run_id": self.run_id, "tick": k, "t": t_rel, "live": len(self._sessions),
            "limit_sessions": self.limit.limit, "occupancy": pool.occupancy,
            "used_blocks": pool.used_blocks, "total_blocks": pool.total_blocks,
            "running": pool.running, "waiting": pool.waiting, "paused": pool.paused,
            "admitted": self.gate.admitted, "rejected": self._rejected(), "evicted": tot.evicted,
            "overrun_ms": overrun_ms, "tokens_out": tokens_tick, "frames_waiting": waiting,
            "stalled": stalled, "p95_ms": self.control.last_p95_ms, "silent_rate": silent_rate,
            "tsat_s": self._occupancy.t_sat_from_now(),
            "rho_slope_per_s": None if fit is None else fit.slope_per_s})
        steps = self.engine.drain_step_stats()
        for step in steps:
            step["run_id"] = self.run_id
            step["t"] = step["t"] - self._t0
        self.store.writer.add_many("steps", steps)
        self.progress = min(1.0, t_rel / cfg.duration_s)

    def _evict_for_stall(self, t_rel: float) -> None:
        """Stall guard: evict the session holding the most KV (frees the most blocks)."""
        if not self._sessions:
            return
        victim = max(self._sessions.values(), key=lambda s: (s.kv_tokens, -s.session_id))
        self._totals.evicted += 1
        self._event(t_rel, "evict", session_id=victim.session_id,
                    reason="stall guard: pool stalled, evicted the largest session",
                    kv_tokens=victim.kv_tokens)
        self._close_session(victim, t_rel, "evicted by stall guard")
        self._stall = StallDetector(STALL_TICKS)  # give the pool a chance to flow again

    # --- records ------------------------------------------------------------------------------
    def _settings_row(self) -> dict:
        cfg = self.config
        return {
            "run_id": self.run_id, "started_at": dt.datetime.now(), "ended_at": None,
            "status": "running", "reason": None, "engine": cfg.engine,
            "simulated": bool(self.engine.simulated), "model": cfg.model, "policy": cfg.policy,
            "window_tokens": cfg.window, "sink_tokens": cfg.sinks, "block_size": cfg.block_size,
            "pool_blocks": cfg.pool_blocks, "frame_ms": cfg.frame_ms, "budget_ms": cfg.budget,
            "tokens_in": cfg.tokens_in, "tokens_out": cfg.tokens_out,
            "wait_budget": cfg.wait_budget, "load": cfg.load, "sessions": cfg.sessions,
            "arrival_rate": cfg.arrival_rate, "session_s": cfg.session_s,
            "duration_s": cfg.duration_s, "admission": cfg.admission, "target": cfg.target,
            "stall_guard": cfg.stall_guard, "memory_guard": cfg.memory_guard, "seed": cfg.seed,
            "settings": json.dumps(cfg.as_dict(), default=str), "summary": None}

    def _write_run_start(self) -> None:
        row = self._settings_row()
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        self.store.writer.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", list(row.values()))
        self._event(0.0, "start", engine=self.config.engine, simulated=self.engine.simulated)

    def _write_run_end(self, status: str, reason: str | None) -> None:
        self._event(self.summary["duration_s"], "end", status=status, reason=reason)
        self.store.writer.execute(
            "UPDATE runs SET status = ?, reason = ?, ended_at = ?, summary = ? WHERE run_id = ?",
            [status, reason, dt.datetime.now(), json.dumps(self.summary, default=str), self.run_id])

    def _summarise(self, status: str, reason: str | None, end_rel: float) -> dict:
        """The run's JSON. Percentiles and the fill come from the store (flushed by now), so
        the loop keeps counters only and its memory stays flat however long the run."""
        cfg = self.config
        tot = self._totals
        frames = tot.frames
        cur = self.store.cursor()
        q = queries.frame_percentiles(cur, self.run_id)
        occ = queries.occupancy(cur, self.run_id)
        occ_t, occ_rho = occ.t.tolist(), occ.occupancy.tolist()
        stall_at = self._first_stall_at
        stalled = stall_at is not None
        if stalled:
            cut = [i for i, t in enumerate(occ_t) if t <= stall_at + self._frame_s]
            tsat = predict_t_sat([occ_t[i] for i in cut], [occ_rho[i] for i in cut])
        else:
            tsat = self._late_t_sat(occ_t, occ_rho)
        max_blocks = max([self._max_blocks_closed] + [s.max_blocks for s in self._sessions.values()])

        def ms(x):
            return None if x is None else round(x, 3)

        return {
            "run_id": self.run_id, "status": status, "reason": reason,
            "engine": cfg.engine, "simulated": bool(self.engine.simulated), "model": cfg.model,
            "policy": cfg.policy, "window": cfg.window, "sinks": cfg.sinks,
            "block_size": cfg.block_size, "pool_blocks": cfg.pool_blocks,
            "frame_ms": cfg.frame_ms, "budget_ms": cfg.budget, "wait_budget": cfg.wait_budget,
            "tokens_in": cfg.tokens_in, "tokens_out": cfg.tokens_out,
            "sessions_offered": len(self._arrivals),
            "admitted": self.gate.admitted, "rejected": self._rejected(), "evicted": tot.evicted,
            "rollovers": tot.rollovers,
            "frames": frames, "silent_frames": tot.silent,
            "silent_rate": round(tot.silent / frames, 4) if frames else None,
            "on_time_rate": round(tot.on_time / frames, 4) if frames else None,
            "naive_on_time_rate": round(tot.naive_on_time / frames, 4) if frames else None,
            "p50_ms": ms(q["p50_ms"]), "p95_ms": ms(q["p95_ms"]), "p99_ms": ms(q["p99_ms"]),
            "naive_p95_ms": ms(q["naive_p95_ms"]),
            "max_occupancy": round(tot.max_occupancy, 4),
            "max_resident_blocks": max_blocks,
            "stalled": stalled,
            "stall_at_s": None if stall_at is None else round(stall_at, 3),
            "tsat_pred_s": None if tsat is None else round(tsat, 3),
            "tsat_observed_s": next((round(t, 3) for t, r in zip(occ_t, occ_rho) if r >= 0.99),
                                    None),
            "final_limit": self.limit.limit,
            "twin_cost_source": getattr(getattr(self.engine, "cost", None), "source", None),
            "tick_overruns": tot.overruns, "max_overrun_ms": round(tot.max_overrun_ms, 3),
            "duration_s": round(end_rel, 3),
        }

    @staticmethod
    def _late_t_sat(occ_t: list[float], occ_rho: list[float]) -> float | None:
        """No stall: extrapolate the last third of the run; None when occupancy is flat."""
        if len(occ_t) < 6:
            return None
        n = len(occ_t)
        fit = fit_occupancy(occ_t[2 * n // 3:], occ_rho[2 * n // 3:])
        if fit is None or fit.slope_per_s < 1e-4:
            return None
        return fit.t_sat()
