"""Concurrency limits after Netflix concurrency-limits: a Limit holds the cap and takes samples;
the admission gate (control.admission) admits against it.

A Limit sees one aggregated sample per control interval (`control.window.WindowedLimit` does
the aggregation), never raw frames: `on_sample(now, latency_ms, inflight, dropped)` where
latency is a p95 and `dropped` says too many frames went silent."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable


LIMITS = ("fixed", "aimd", "gradient")


@runtime_checkable
class Limit(Protocol):
    """What every limit shares (AIMD, gradient, fixed) and all that the gate and the runner use.

    `limit` is the current cap on live sessions; `on_sample` takes one aggregated control sample
    and returns the new cap; `retarget` moves the latency target (a fraction of the budget; a
    fixed cap has none and ignores it). A runner swaps a limit live in its live settings
    (runtime/live_settings.py), which the gate and the windowed limit read; never by writing
    attributes."""

    kind: str

    @property
    def limit(self) -> int: ...

    def on_sample(self, now: float, latency_ms: float, inflight: int, dropped: bool) -> int: ...

    def retarget(self, target_fraction: float) -> None: ...


class _Listeners:
    def __init__(self) -> None:
        self._listeners: list[Callable[[int], None]] = []

    def on_change(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def _notify(self, old: int, new: int) -> None:
        if new != old:
            for listener in self._listeners:
                listener(new)


class _TargetedLimit(_Listeners):
    """A limit steered by frame latency against target_fraction · budget."""

    def __init__(self, config, budget_ms: float) -> None:
        super().__init__()
        if budget_ms <= 0:
            raise ValueError(f"budget {budget_ms} ms must be > 0")
        self.config = config
        self.budget_ms = budget_ms

    @property
    def target_ms(self) -> float:
        return self.config.target_fraction * self.budget_ms

    def retarget(self, target_fraction: float) -> None:
        self.config = replace(self.config, target_fraction=target_fraction)


def check_target(target_fraction, what: str = "target") -> float:
    """The one check of a latency target, a fraction of the budget (config, changes, limits)."""
    if not isinstance(target_fraction, (int, float)) or not 0 < target_fraction <= 1:
        raise ValueError(f"{what} {target_fraction} must be in (0, 1] of the budget")
    return float(target_fraction)


def _check_bounds(initial: int, min_limit: int, max_limit: int) -> None:
    if not 1 <= min_limit <= max_limit:
        raise ValueError(f"limits min {min_limit} / max {max_limit}: need 1 ≤ min ≤ max")
    if not min_limit <= initial <= max_limit:
        raise ValueError(f"initial limit {initial} must be in [{min_limit}, {max_limit}]")


@dataclass(frozen=True)
class AIMDConfig:
    initial: int = 4
    min_limit: int = 1
    max_limit: int = 1024
    increase: int = 1
    backoff: float = 0.9
    target_fraction: float = 0.8  # latency target as a fraction of the frame budget
    headroom: int = 1  # grow only when inflight ≥ limit − headroom
    # Near the target (p95 over near_target · target) grow only after `settle_intervals`
    # samples in a row at the target since the last change: a session stays for minutes, so
    # the cap waits to see what the last one admitted costs before it offers another (on vLLM,
    # 2 cores, growing on every good interval let the cap pass N_c between two intervals over
    # the target, and the sessions it admitted stayed).
    near_target: float = 0.8
    settle_intervals: int = 3

    def __post_init__(self) -> None:
        _check_bounds(self.initial, self.min_limit, self.max_limit)
        if not 0 < self.near_target <= 1:
            raise ValueError(f"near-target share {self.near_target} must be in (0, 1]")
        if not 1 <= self.settle_intervals <= 100:
            raise ValueError(f"settle intervals {self.settle_intervals} must be in [1, 100]")
        if self.increase < 1:
            raise ValueError(f"increase {self.increase} must be ≥ 1")
        if not 0.5 <= self.backoff < 1:
            raise ValueError(f"backoff {self.backoff} must be in [0.5, 1)")
        check_target(self.target_fraction)
        if self.headroom < 0:
            raise ValueError(f"headroom {self.headroom} must be ≥ 0")


class AIMDLimit(_TargetedLimit):
    """Additive increase while latency has headroom, a decrease anchored on live sessions.

    Netflix's AIMD cuts `limit × backoff` on every bad sample: right for requests that finish
    in milliseconds, wrong for sessions that stay for minutes and are never evicted, where a cap
    cut below the live count serves no one and only starves the next arrivals (issue 24: the
    cap decayed to 1 under 20 live sessions served at the target). So, as the paper's gateway:
    - over target or a drop: cut to min(limit, ⌊backoff · live⌋), never below that anchor
      while those sessions stay (repeated bad samples at the same live count do not decay it);
    - latency has room: the cap is at least the live count (it follows live back up after a
      cut, so a session that leaves is replaced at once), and grows by `increase` when live is
      within `headroom` of it (a cap nobody uses is not grown); near the target only once
      `settle_intervals` samples in a row were at it since the last cut or growth."""

    kind = "aimd"

    def __init__(self, config: AIMDConfig, budget_ms: float) -> None:
        super().__init__(config, budget_ms)
        self._limit = config.initial
        self._at_target = 0  # samples in a row at the target since the last cut or growth

    @property
    def limit(self) -> int:
        return self._limit

    def on_sample(self, now: float, latency_ms: float, inflight: int, dropped: bool) -> int:
        cfg = self.config
        old = self._limit
        if dropped or latency_ms > self.target_ms:
            anchor = math.floor(cfg.backoff * inflight)
            self._limit = max(cfg.min_limit, min(self._limit, anchor))
            self._at_target = 0
        else:
            self._at_target += 1
            base = max(self._limit, inflight)
            settled = (latency_ms <= cfg.near_target * self.target_ms
                       or self._at_target >= cfg.settle_intervals)
            grow = cfg.increase if inflight >= base - cfg.headroom and settled else 0
            if grow:
                self._at_target = 0
            self._limit = min(cfg.max_limit, base + grow)
        self._notify(old, self._limit)
        return self._limit


@dataclass(frozen=True)
class GradientConfig:
    initial: int = 4
    min_limit: int = 1
    max_limit: int = 1024
    target_fraction: float = 0.8
    smoothing: float = 0.2  # weight of the new estimate
    tolerance: float = 1.0  # latency may reach tolerance·target before the gradient bites
    # A cut never takes the estimate below ⌊anchor · live⌋ (as AIMD's backoff anchor): live
    # sessions stay for minutes, so a gradient just over 1 must not decay the cap under them.
    anchor: float = 0.9

    def __post_init__(self) -> None:
        _check_bounds(self.initial, self.min_limit, self.max_limit)
        check_target(self.target_fraction)
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing {self.smoothing} must be in (0, 1]")
        if not 1 <= self.tolerance <= 2:
            raise ValueError(f"tolerance {self.tolerance} must be in [1, 2]")
        if not 0 <= self.anchor < 1:
            raise ValueError(f"anchor {self.anchor} must be in [0, 1) of the live sessions")


class GradientLimit(_TargetedLimit):
    """Gradient (Envoy / Netflix Gradient2 family): scale the cap by target/measured latency,
    plus a √limit queue allowance so it can probe upwards when latency has headroom. A cut
    stops at ⌊anchor · live⌋, so sessions that stay do not see the cap decay under them."""

    kind = "gradient"

    def __init__(self, config: GradientConfig, budget_ms: float) -> None:
        super().__init__(config, budget_ms)
        self._estimate = float(config.initial)

    @property
    def limit(self) -> int:
        return int(self._estimate)

    def on_sample(self, now: float, latency_ms: float, inflight: int, dropped: bool) -> int:
        cfg = self.config
        old = self.limit
        if dropped:
            gradient = 0.5
        else:
            gradient = max(0.5, min(1.0, cfg.tolerance * self.target_ms / max(latency_ms, 1e-6)))
        # Only probe upwards when the cap is actually in use (as AIMD does).
        queue = math.sqrt(self._estimate) if inflight >= self.limit - 1 and gradient >= 1 else 0.0
        new = self._estimate * gradient + queue
        estimate = (1 - cfg.smoothing) * self._estimate + cfg.smoothing * new
        if estimate < self._estimate:  # a cut stops at the live anchor (or where it already was)
            estimate = max(estimate, min(self._estimate, math.floor(cfg.anchor * inflight)))
        self._estimate = min(cfg.max_limit, max(cfg.min_limit, estimate))
        self._notify(old, self.limit)
        return self.limit


class FixedLimit(_Listeners):
    """The operator's override: a constant cap."""

    kind = "fixed"

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"limit {limit} must be ≥ 1")
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def on_sample(self, now: float, latency_ms: float, inflight: int, dropped: bool) -> int:
        return self._limit

    def retarget(self, target_fraction: float) -> None:
        """A fixed cap has no latency target; the runner keeps the target for a later limit."""


def make_limit(kind: str, budget_ms: float, cap: int, target_fraction: float,
               overrides: dict | None = None) -> Limit:
    """The limit named `kind` for a run offering up to `cap` sessions. AIMD and gradient start
    at min(4, cap) and may grow to cap; `overrides` are the limit's own config fields (for a
    fixed limit, `limit`). Bad values raise the config's ValueError."""
    cap = max(cap, 1)
    overrides = overrides or {}
    if kind == "aimd":
        params = {"initial": min(4, cap), "max_limit": cap, "target_fraction": target_fraction}
        return AIMDLimit(AIMDConfig(**{**params, **overrides}), budget_ms)
    if kind == "gradient":
        params = {"initial": min(4, cap), "max_limit": cap, "target_fraction": target_fraction}
        return GradientLimit(GradientConfig(**{**params, **overrides}), budget_ms)
    if kind == "fixed":
        return FixedLimit(int(overrides.get("limit", cap)))
    raise ValueError(f"limit {kind!r} is not one of {', '.join(LIMITS)}")
