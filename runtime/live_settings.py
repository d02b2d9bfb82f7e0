"""LiveSettings: what a running run is set to now, as one frozen value with one owner.

Shape:

    LiveSettings.at_start(config, limit, policy)   the run's start (RunConfig's values)
    LiveState.swap(policy=…, target=…, …)          every live change: a new LiveSettings,
                                                   swapped in at once (runtime/changes.py)
    LiveState.now                                  what the Controls page, the Live header,
                                                   settings_history, the summary read
    LiveState.limit                                the admission limit in force: the gate and
                                                   the windowed limit read it here (the owner)

The engine keeps its own KV policy (it applies it); `policy` here is what the run confirmed,
swapped when the engine says a change is in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from control.limits import Limit, check_target
from engine.contract import KVPolicy

# What an operator, a schedule or `--change` may move while a run runs; `limit_params` goes
# with `limit` (the new limit's own settings).
LIVE_KEYS = ("window", "sinks", "policy", "target", "limit", "stall_guard")


def policy_text(policy: KVPolicy) -> str:
    """How every view names a KV policy: "unbounded", "window W=256 S=16"."""
    if policy.kind == "unbounded":
        return "unbounded"
    return f"window W={policy.window_tokens} S={policy.sink_tokens}"


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


@dataclass(frozen=True)
class LiveSettings:
    policy: KVPolicy  # confirmed by the engine
    target: float  # fraction of the frame budget the adaptive limits aim at
    limit: Limit  # the admission limit object (its cap moves under AIMD/gradient)
    stall_guard: bool
    memory_guard: bool  # fixed for the run; here so one value says everything in force

    def __post_init__(self) -> None:
        check_target(self.target)
        for name, flag in (("stall guard", self.stall_guard), ("memory guard", self.memory_guard)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} {flag!r} must be true or false")

    @classmethod
    def at_start(cls, config, limit: Limit, policy: KVPolicy) -> "LiveSettings":
        return cls(policy, config.target, limit, config.stall_guard, config.memory_guard)

    @property
    def policy_label(self) -> str:
        return policy_text(self.policy)

    def summary_values(self) -> dict:
        """The settings in force, as the run summary's `settings` reports them."""
        return {"policy": self.policy.kind, "window": self.policy.window_tokens,
                "sinks": self.policy.sink_tokens, "target": self.target,
                "admission": self.limit.kind, "stall_guard": self.stall_guard}

    def history_row(self, run_id: str, t_rel: float, setting: str, change: str) -> dict:
        """One settings_history row: the whole of what is in force after `change`."""
        return {"run_id": run_id, "t": t_rel, "setting": setting, "change": change,
                "policy": self.policy.kind, "window_tokens": self.policy.window_tokens,
                "sink_tokens": self.policy.sink_tokens, "target": self.target,
                "admission": self.limit.kind, "limit_sessions": self.limit.limit,
                "stall_guard": self.stall_guard, "memory_guard": self.memory_guard}

    def header(self) -> dict:
        """What the console shows of a running run's settings (text values)."""
        return {"policy": self.policy_label, "limit": self.limit.kind, "cap": self.limit.limit,
                "target": self.target, "stall_guard": on_off(self.stall_guard)}


class LiveState:
    """The run's one owner of its LiveSettings: read from any thread, swapped by the run
    thread (a reference swap under a lock: a reader sees the old value or the new one)."""

    def __init__(self, settings: LiveSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()

    @property
    def now(self) -> LiveSettings:
        return self._settings

    def limit(self) -> Limit:
        """The admission limit in force (what Gate and WindowedLimit are handed to read)."""
        return self._settings.limit

    def swap(self, **changes) -> LiveSettings:
        with self._lock:
            self._settings = replace(self._settings, **changes)
            return self._settings
