"""Live changes: what happens when W, S, the policy, the latency target, the admission limit
or the stall guard change while a run is running.

Shape of a change:

    any thread     LiveChanges.request(window=32)   validate now (ValueError, one line), queue
    run thread     LiveChanges.apply_pending(t)     at the next tick, in order; the engine is
                                                    asked (engine.set_policy) for W/S/policy
                                                    and may refuse; each outcome is an event
                                                    `param_change` or `param_rejected`

The live values (target, stall guard, the limit through the gate) are read by the loop from
here; nothing else writes them.
"""

from __future__ import annotations

import logging
import threading

from control.limits import Limit, WindowedLimit, make_limit
from engine.contract import Engine, KVPolicy
from runtime.config import RunConfig
from runtime.record import Recorder
from runtime.summary import on_off

logger = logging.getLogger(__name__)

KEYS = ("window", "sinks", "policy", "target", "limit", "limit_params", "stall_guard")


def policy_text(policy: KVPolicy) -> str:
    if policy.kind == "unbounded":
        return "unbounded"
    return f"window W={policy.window_tokens} S={policy.sink_tokens}"


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


class LiveChanges:
    def __init__(self, config: RunConfig, engine: Engine, recorder: Recorder, gate,
                 control: WindowedLimit, on_policy=None) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.gate = gate
        self.control = control
        self._on_policy = on_policy  # called after a W/S/policy change took effect
        self.target = config.target  # fraction of the budget; kept under a fixed limit too
        self.stall_guard = config.stall_guard
        self.history: list[dict] = []  # applied changes, in order: t, setting, change, old, new
        self._queue: list[tuple[str, object]] = []
        self._lock = threading.Lock()

    # --- the record of settings ---------------------------------------------------------------
    def values(self) -> dict:
        """The settings in force now, as the summary reports them."""
        policy = self.engine.policy
        return {"policy": policy.kind, "window": policy.window_tokens,
                "sinks": policy.sink_tokens, "target": self.target,
                "admission": self.gate.limit.kind, "stall_guard": self.stall_guard}

    def snapshot(self, t_rel: float, setting: str, change: str) -> None:
        """One row of the run's settings history (a time series: the start, then each change)."""
        policy = self.engine.policy
        self.recorder.add("settings_history", {
            "run_id": self.recorder.run_id, "t": t_rel, "setting": setting, "change": change,
            "policy": policy.kind, "window_tokens": policy.window_tokens,
            "sink_tokens": policy.sink_tokens, "target": self.target,
            "admission": self.gate.limit.kind, "limit_sessions": self.gate.limit.limit,
            "stall_guard": self.stall_guard, "memory_guard": self.config.memory_guard})

    def make_limit(self, kind: str, overrides: dict | None = None) -> Limit:
        cfg = self.config
        return make_limit(kind, cfg.budget, cfg.sessions, self.target, overrides)

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
            old = self.engine.policy
            policy = KVPolicy(change.get("policy", old.kind),
                              change.get("window", old.window_tokens),
                              change.get("sinks", old.sink_tokens))
            policy.check_block_size(self.config.block_size)
            refusal = self.engine.policy_change_refusal(policy)
            if refusal:
                raise ValueError(refusal)
            queued.append(("policy", policy))
            done.append(f"KV policy {policy_text(old)} → {policy_text(policy)}")
        if "target" in change:
            target = float(change["target"])
            if not 0 < target <= 1:
                raise ValueError(f"target {target} must be in (0, 1] of the budget")
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
        return "applied at the next tick: " + "; ".join(done)

    # --- run thread ---------------------------------------------------------------------------
    def apply_pending(self, t_rel: float) -> None:
        with self._lock:
            changes, self._queue = self._queue, []
        for key, value in changes:
            if key == "policy":
                detail = self._apply_policy(value, t_rel)
                if detail is None:
                    continue
            elif key == "target":
                detail = {"old": self.target, "new": value,
                          "change": f"target {self.target:.2f} → {value:.2f}"}
                self.target = value
                self.gate.limit.retarget(value)
            elif key == "limit":
                old = self.gate.limit
                detail = {"old": old.kind, "new": value.kind, "cap": value.limit,
                          "change": f"limit {old.kind} {old.limit} → {value.kind} {value.limit}"}
                self.gate.set_limit(value)
                self.control.set_limit(value)
            else:
                detail = {"old": on_off(self.stall_guard), "new": on_off(value),
                          "change": f"stall guard {on_off(self.stall_guard)} → {on_off(value)}"}
                self.stall_guard = value
            self.recorder.event(t_rel, "param_change", setting=key, **detail)
            self.history.append({"t": round(t_rel, 3), "setting": key, "change": detail["change"],
                                 "old": detail["old"], "new": detail["new"]})
            self.snapshot(t_rel, key, detail["change"])

    def _apply_policy(self, policy: KVPolicy, t_rel: float) -> dict | None:
        old = self.engine.policy
        try:
            applied = self.engine.set_policy(policy)
            reason = "the engine refused it"
        except (ValueError, RuntimeError, TimeoutError) as exc:
            applied, reason = False, f"{type(exc).__name__}: {exc}"
        if not applied:  # the run goes on with the old policy; the operator sees why
            logger.warning("KV policy change to %s failed: %s", policy_text(policy), reason)
            self.recorder.event(t_rel, "param_rejected", setting="policy",
                                new=policy_text(policy), reason=reason)
            return None
        if self._on_policy is not None:
            self._on_policy()
        return {"old": policy_text(old), "new": policy_text(policy),
                "change": policy_change_text(old, policy)}
