"""The admission gate: admit or reject an arriving session against the limit and the memory
guard. Admitted sessions are never evicted here (only the stall guard evicts)."""

from __future__ import annotations

import math
from dataclasses import dataclass

REJECT_REASONS = ("over_limit", "memory_guard")


@dataclass(frozen=True)
class MemoryGuardConfig:
    max_plateau: float = 0.9  # refuse when the projected ρ∞ with one more session reaches this
    safety: float = 1.2  # the pool must outlast the lifetime by this factor

    def __post_init__(self) -> None:
        if not 0 < self.max_plateau <= 1:
            raise ValueError(f"memory guard plateau {self.max_plateau} must be in (0, 1]")
        if not 1 <= self.safety <= 10:
            raise ValueError(f"memory guard safety {self.safety} must be in [1, 10]")


class MemoryGuard:
    """Refuses a session when the pool trajectory says it would saturate within the sessions'
    expected lifetime, or when the plateau with one more session reaches `max_plateau`.

    Inputs are truthful memory signals, not latency: ρ now, the live count, the fitted growth
    rate per session (ρ/s) and the plateau share per session (ρ each bounded session holds)."""

    def __init__(self, config: MemoryGuardConfig) -> None:
        self.config = config

    def admits(self, rho_now: float, live: int, growth_per_session_per_s: float,
               plateau_per_session: float | None, lifetime_s: float) -> bool:
        n = live + 1
        if plateau_per_session is not None:
            # Bounded KV: occupancy settles at ≈ n sessions' share.
            return n * plateau_per_session < self.config.max_plateau
        growth = n * max(growth_per_session_per_s, 0.0)
        if growth <= 0:
            return rho_now < self.config.max_plateau
        t_sat = (1.0 - rho_now) / growth
        return t_sat > lifetime_s * self.config.safety and not math.isclose(t_sat, 0.0)


class Gate:
    """Admits while live < limit and the memory guard (if any) agrees; reasons are recorded."""

    def __init__(self, limit, guard: MemoryGuard | None = None) -> None:
        self.limit = limit
        self.guard = guard
        self.live = 0
        self.admitted = 0
        self.rejected = {reason: 0 for reason in REJECT_REASONS}

    def acquire(self, memory: dict | None = None) -> str | None:
        """None when admitted, else the reason. `memory` holds MemoryGuard.admits' inputs."""
        if self.live >= self.limit.limit:
            self.rejected["over_limit"] += 1
            return "over_limit"
        if self.guard is not None and memory is not None and not self.guard.admits(
                live=self.live, **memory):
            self.rejected["memory_guard"] += 1
            return "memory_guard"
        self.live += 1
        self.admitted += 1
        return None

    def release(self) -> None:
        assert self.live > 0, "release without acquire"
        self.live -= 1
