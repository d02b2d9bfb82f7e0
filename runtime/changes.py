"""Live changes: what happens when W, S, the policy, the latency target, the admission limit
or the stall guard change while a run is running.

Shape of a change:

    any thread     LiveChanges.request(window=32)   validate now (ValueError, one line), queue
    run thread     LiveChanges.apply_pending(t)     at the next tick, in order: target, limit
                                                    and stall guard at once; a W/S/policy
                                                    change is started in the engine
                                                    (engine.begin_policy_change, a future) and
                                                    the tick goes on submitting frames
    run thread     LiveChanges.apply_pending(t')    a later tick finds the future done: the
                                                    outcome is an event `param_change` (with
                                                    requested_t and confirm_ms) or
                                                    `param_rejected`; one KV change at a time

Every applied change swaps the run's LiveSettings (runtime/live_settings.py, its one owner):
the gate, the control sampler, the loop and the console read it there; nothing else writes it.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from control.limits import Limit, check_target, make_limit
from engine.contract import Engine, KVPolicy
from runtime.config import RunConfig
from runtime.live_settings import LIVE_KEYS, LiveState, on_off, policy_text
from runtime.record import Recorder

logger = logging.getLogger(__name__)

KEYS = (*LIVE_KEYS, "limit_params")  # limit_params: the settings of a new `limit`


def policy_change_text(old: KVPolicy, new: KVPolicy) -> str:
    """How a chart rule and the run header name a KV change: "W 128 → 32", "S 16 → 0"."""
    if old.kind != new.kind:
        return f"{policy_text(old)} → {policy_text(new)}"
    parts = []
    if old.window_tokens != new.window_tokens:
        parts.append(f"W {old.window_tokens} → {new.window_tokens}")
    if old.sink_tokens != new.sink_tokens:
        parts.append(f"S {old.sink_tokens} → {new.sink_tokens}")
    return ", ".join(parts) or f"{policy_text(new)} (unchanged)"


@dataclass
class PendingChange:
    """A KV change the engine is applying: what was asked, from what, and when."""

    future: Future  # Engine.begin_policy_change's: resolves once applied, raises if not
    policy: KVPolicy
    old: KVPolicy
    requested_t: float  # run-relative tick that started it
    started_perf_s: float  # perf_counter at the start
    confirmed_perf_s: list[float] = field(default_factory=list)  # set by the future's callback


class LiveChanges:
    def __init__(self, config: RunConfig, engine: Engine, recorder: Recorder, live: LiveState,
                 on_policy=None) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.live = live
        self._on_policy = on_policy  # called after a W/S/policy change took effect
        self.history: list[dict] = []  # applied changes, in order: t, setting, change, old, new
        self._queue: list[tuple[str, object]] = []
        self._pending: PendingChange | None = None  # one KV change under way at a time
        self._lock = threading.Lock()

    # --- the record of settings ---------------------------------------------------------------
    def snapshot(self, t_rel: float, setting: str, change: str) -> None:
        """One row of the run's settings history (a time series: the start, then each change)."""
        self.recorder.add("settings_history",
                          self.live.now.history_row(self.recorder.run_id, t_rel, setting, change))

    def make_limit(self, kind: str, overrides: dict | None = None) -> Limit:
        cfg = self.config
        return make_limit(kind, cfg.budget, cfg.sessions, self.live.now.target, overrides)

    # --- any thread ---------------------------------------------------------------------------
    def request(self, **change) -> str:
        """Validate a change now (ValueError with a one-line reason) and queue it for the next
        tick. Returns the confirmation to show the operator.

        Keys: window, sinks, policy (the KV policy); target (fraction of the budget);
        limit ("fixed" | "aimd" | "gradient") with limit_params (dict); stall_guard (bool).
        """
        unknown = sorted(set(change) - set(KEYS))
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
        queued, done = [], []
        if {"window", "sinks", "policy"} & set(change):
            old = self._policy_ahead()  # a change builds on the ones already on their way
            policy = KVPolicy(change.get("policy", old.kind),
                              change.get("window", old.window_tokens),
                              change.get("sinks", old.sink_tokens))
            refusal = self.engine.policy_change_refusal(policy)  # the one check
            if refusal:
                raise ValueError(refusal)
            queued.append(("policy", policy))
            done.append(f"KV policy {policy_text(old)} → {policy_text(policy)}")
        if "target" in change:
            target = check_target(change["target"])
            queued.append(("target", target))
            done.append(f"latency target {target:.2f}·budget")
        if "limit" in change:
            limit = self.make_limit(change["limit"], change.get("limit_params"))
            queued.append(("limit", limit))
            done.append(f"limit {change['limit']} (cap {limit.limit})")
        if "stall_guard" in change:
            guard = change["stall_guard"]
            if not isinstance(guard, bool):
                raise ValueError(f"stall guard {guard!r} must be true or false")
            queued.append(("stall_guard", guard))
            done.append(f"stall guard {on_off(guard)}")
        with self._lock:  # all or nothing: validated above before any is queued
            self._queue.extend(queued)
        how = ("applied at the next tick; a KV change takes effect between two engine steps "
               "without holding the sessions" if queued and queued[0][0] == "policy"
               else "applied at the next tick")
        return f"{how}: " + "; ".join(done)

    def _policy_ahead(self) -> KVPolicy:
        """The KV policy the engine will have once every queued or pending change is in."""
        with self._lock:
            queued = [value for key, value in self._queue if key == "policy"]
        if queued:
            return queued[-1]
        if self._pending is not None:
            return self._pending.policy
        return self.live.now.policy

    # --- run thread ---------------------------------------------------------------------------
    def apply_pending(self, t_rel: float) -> None:
        """At a tick: record a KV change the engine confirmed since the last tick, start the
        next queued one, apply the others (instant: no engine involved). Never waits on the
        engine: the tick goes on submitting frames while a change is under way."""
        self._poll(t_rel)
        with self._lock:
            changes, self._queue = self._queue, []
        for i, (key, value) in enumerate(changes):
            if key == "policy":
                if self._pending is not None:  # one KV change at a time, in order
                    with self._lock:
                        self._queue[:0] = [c for c in changes[i:] if c[0] == "policy"]
                    changes = [c for c in changes[i:] if c[0] != "policy"]
                    for other in changes:
                        self._apply_instant(*other, t_rel)
                    return
                self._begin_policy(value, t_rel)
                self._poll(t_rel)  # an engine that applies at once (the twin) is done now
            else:
                self._apply_instant(key, value, t_rel)

    def settle(self, t_rel: float, timeout_s: float = 30.0) -> None:
        """At the run's end: wait (bounded) for a KV change still under way, so the summary
        says where it landed."""
        if self._pending is not None:
            wait([self._pending.future], timeout=timeout_s)
            self._poll(t_rel)

    def _apply_instant(self, key: str, value, t_rel: float) -> None:
        now = self.live.now
        if key == "target":
            detail = {"old": now.target, "new": value,
                      "change": f"target {now.target:.2f} → {value:.2f}"}
            now.limit.retarget(value)
            self.live.swap(target=value)
        elif key == "limit":
            old = now.limit
            detail = {"old": old.kind, "new": value.kind, "cap": value.limit,
                      "change": f"limit {old.kind} {old.limit} → {value.kind} {value.limit}"}
            self.live.swap(limit=value)  # the gate and the control sampler read it there
        else:
            detail = {"old": on_off(now.stall_guard), "new": on_off(value),
                      "change": f"stall guard {on_off(now.stall_guard)} → {on_off(value)}"}
            self.live.swap(stall_guard=value)
        self._record(key, detail, t_rel)

    def _record(self, key: str, detail: dict, t_rel: float) -> None:
        self.recorder.event(t_rel, "param_change", setting=key, **detail)
        self.history.append({"t": round(t_rel, 3), "setting": key, "change": detail["change"],
                             "old": detail["old"], "new": detail["new"]})
        self.snapshot(t_rel, key, detail["change"])

    def _begin_policy(self, policy: KVPolicy, t_rel: float) -> None:
        old = self.live.now.policy
        try:
            future = self.engine.begin_policy_change(policy)
        except (ValueError, RuntimeError) as exc:
            self._rejected(policy, f"{type(exc).__name__}: {exc}", t_rel)
            return
        pending = PendingChange(future, policy, old, t_rel, time.perf_counter())
        future.add_done_callback(lambda _: pending.confirmed_perf_s.append(time.perf_counter()))
        self._pending = pending

    def _poll(self, t_rel: float) -> None:
        pending = self._pending
        if pending is None or not pending.future.done():
            return
        self._pending = None
        policy, old = pending.policy, pending.old
        try:
            pending.future.result()
        except Exception as exc:  # noqa: BLE001 - any failure leaves the old policy in force
            self._rejected(policy, f"{type(exc).__name__}: {exc}", t_rel)
            return
        self.live.swap(policy=self.engine.policy)  # what the engine applies, as it says
        if self._on_policy is not None:
            self._on_policy()
        # requested_t: the tick that started it; t (the event's): the tick that saw it done.
        self._record("policy", {
            "old": policy_text(old), "new": policy_text(policy),
            "change": policy_change_text(old, policy),
            "requested_t": round(pending.requested_t, 3),
            "confirm_ms": round(((pending.confirmed_perf_s or [time.perf_counter()])[0]
                                 - pending.started_perf_s) * 1e3, 1)},
            t_rel)

    def _rejected(self, policy: KVPolicy, reason: str, t_rel: float) -> None:
        # The run goes on with the old policy; the operator sees why.
        logger.warning("KV policy change to %s failed: %s", policy_text(policy), reason)
        self.recorder.event(t_rel, "param_rejected", setting="policy",
                            new=policy_text(policy), reason=reason)
