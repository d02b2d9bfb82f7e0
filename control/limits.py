"""Concurrency limits after Netflix concurrency-limits: a Limit holds the cap, a Gate admits."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class AIMDConfig:
    initial: int = 4
    min_limit: int = 1
    max_limit: int = 1024
    increase: int = 1
    backoff: float = 0.75
    target_fraction: float = 0.8  # latency target as a fraction of the frame budget
    headroom: int = 1  # grow only when inflight ≥ limit − headroom

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.max_limit:
            raise ValueError(f"limits min {self.min_limit} / max {self.max_limit}: need 1 ≤ min ≤ max")
        if not self.min_limit <= self.initial <= self.max_limit:
            raise ValueError(f"initial limit {self.initial} must be in [{self.min_limit}, {self.max_limit}]")
        if self.increase < 1:
            raise ValueError(f"increase {self.increase} must be ≥ 1")
        if not 0.5 <= self.backoff < 1:
            raise ValueError(f"backoff {self.backoff} must be in [0.5, 1)")
        if not 0 < self.target_fraction <= 1:
            raise ValueError(f"target {self.target_fraction} must be in (0, 1] of the budget")
        if self.headroom < 0:
            raise ValueError(f"headroom {self.headroom} must be ≥ 0")


class AIMDLimit:
    """Additive increase while latency has headroom, multiplicative decrease on a drop."""

    def __init__(self, config: AIMDConfig, budget_ms: float) -> None:
        if budget_ms <= 0:
            raise ValueError(f"budget {budget_ms} ms must be > 0")
        self.config = config
        self.budget_ms = budget_ms
        self._limit = config.initial
        self._listeners: list[Callable[[int], None]] = []

    @property
    def limit(self) -> int:
        return self._limit

    def on_change(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def on_sample(self, now: float, latency_ms: float, inflight: int, dropped: bool) -> int:
        cfg = self.config
        old = self._limit
        if dropped or latency_ms > cfg.target_fraction * self.budget_ms:
            self._limit = max(cfg.min_limit, math.floor(self._limit * cfg.backoff))
        elif inflight >= self._limit - cfg.headroom:
            self._limit = min(cfg.max_limit, self._limit + cfg.increase)
        if self._limit != old:
            for listener in self._listeners:
                listener(self._limit)
        return self._limit


class FixedLimit:
    """No control: admit everything up to a fixed cap (the `--admission off` case)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit {limit} must be ≥ 1")
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def on_sample(self, now: float, latency_ms: float, inflight: int, dropped: bool) -> int:
        return self._limit


class Gate:
    """Admits a session while live < limit; rejections carry a reason."""

    def __init__(self, limit) -> None:
        self.limit = limit
        self.live = 0
        self.admitted = 0
        self.rejected = 0

    def acquire(self) -> str | None:
        """None when admitted, else the rejection reason."""
        if self.live >= self.limit.limit:
            self.rejected += 1
            return "over_limit"
        self.live += 1
        self.admitted += 1
        return None

    def release(self) -> None:
        assert self.live > 0, "release without acquire"
        self.live -= 1
