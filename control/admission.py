"""The admission gate: admit or reject an arriving session against the limit and the memory
guard. Admitted sessions are never evicted here (only the stall guard evicts)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from control.limits import Limit

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


@dataclass(frozen=True)
class MemorySignals:
    """What the memory guard weighs for one arrival, on the pool it would join (the engine's,
    or one data-parallel rank's)."""

    rho_now: float  # the pool's occupancy now
    growth_per_session_per_s: float  # ρ one session adds per second (fitted, floored)
    plateau_per_session: float | None  # ρ one bounded session settles at; None: unbounded
    lifetime_s: float  # how long an admitted session is expected to stay
    live: int | None = None  # sessions on that pool; None: every session the gate holds

    def __post_init__(self) -> None:
        for name, value in (("rho_now", self.rho_now), ("lifetime_s", self.lifetime_s),
                            ("growth_per_session_per_s", self.growth_per_session_per_s)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"memory signal {name} {value!r} must be finite and ≥ 0")
        if self.plateau_per_session is not None and not self.plateau_per_session >= 0:
            raise ValueError(f"plateau per session {self.plateau_per_session!r} must be ≥ 0")
        if self.live is not None and self.live < 0:
            raise ValueError(f"live sessions {self.live} must be ≥ 0")


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


@dataclass(frozen=True)
class Ticket:
    """Proof of one admission; handed back to `Gate.release` when the session closes."""

    number: int


class Gate:
    """Admits while live < limit and the memory guard (if any) agrees; reasons are recorded.

    Like vLLM's KV manager, `acquire` returns the grant (a Ticket) or None when there is no
    capacity; `last_rejection` then says why (one of REJECT_REASONS)."""

    def __init__(self, limit_of: Callable[[], Limit], guard: MemoryGuard | None = None) -> None:
        # The limit's owner is the run's live settings (runtime/live_settings.py): the gate
        # reads the limit in force through `limit_of` and never holds a copy of its own.
        self._limit_of = limit_of
        self.guard = guard
        self._held: set[int] = set()
        self.admitted = 0
        self.rejected = {reason: 0 for reason in REJECT_REASONS}
        self.last_rejection: str | None = None

    @property
    def limit(self) -> Limit:
        """The limit in force; a swap by its owner applies from the next arrival, and the
        sessions already admitted stay (only the stall guard evicts)."""
        return self._limit_of()

    @property
    def live(self) -> int:
        return len(self._held)

    def acquire(self, memory: MemorySignals | None = None) -> Ticket | None:
        """A ticket when admitted, else None with the reason in `last_rejection`. `memory`:
        the guard's inputs; None skips the guard."""
        if self.live >= self.limit.limit:
            return self._reject("over_limit")
        if self.guard is not None and memory is not None and not self.guard.admits(
                memory.rho_now, self.live if memory.live is None else memory.live,
                memory.growth_per_session_per_s, memory.plateau_per_session,
                memory.lifetime_s):
            return self._reject("memory_guard")
        self.admitted += 1
        ticket = Ticket(self.admitted)
        self._held.add(ticket.number)
        self.last_rejection = None
        return ticket

    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        self.last_rejection = reason
        return None

    def release(self, ticket: Ticket) -> None:
        assert ticket.number in self._held, f"release of ticket {ticket.number} not held"
        self._held.remove(ticket.number)
