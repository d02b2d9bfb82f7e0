"""One monitor per KV pool: a data-parallel rank's pool, or the whole engine's when it has one
rank (one rank is a fleet of one). Each monitor runs the stall rule (control.signals), keeps its
ρ(t) fit and what the summary reports; the engine-wide tick row is derived from them
(runtime/telemetry.py). Also the two small records that cross into and out of them: a tick's
counts from the sessions, and the memory signals for one arrival.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from control.admission import MemorySignals
from control.signals import FULL_OCCUPANCY, OccupancyTracker, StallDetector
from engine.contract import KVPolicy, PoolStats
from runtime.config import RunConfig


@dataclass(frozen=True)
class TickCounts:
    """What the sessions did since the last tick: tokens out and frames owed, in all and per
    rank (key None: sessions whose rank the engine did not say)."""

    tokens_out: int
    frames_owed: int
    tokens_by_rank: Mapping[int | None, int] = field(default_factory=dict)
    owed_by_rank: Mapping[int | None, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens_out < 0 or self.frames_owed < 0:
            raise ValueError(f"tick counts {self.tokens_out}, {self.frames_owed} must be ≥ 0")

    def on(self, rank: int, fleet: int) -> tuple[int, int]:
        """(tokens out, frames owed) on `rank`; a fleet of one owns them all."""
        if fleet == 1:
            return self.tokens_out, self.frames_owed
        return self.tokens_by_rank.get(rank, 0), self.owed_by_rank.get(rank, 0)


@dataclass(frozen=True)
class PoolSample:
    rank: int
    pool: PoolStats
    tokens_out: int
    frames_owed: int
    stalled: bool


class PoolMonitor:
    """One pool's stall detector, ρ(t) fit and run record. Used from the run thread only."""

    def __init__(self, rank: int, frame_s: float) -> None:
        self.rank = rank
        self._stall = StallDetector()
        self.first_stall_at: float | None = None  # survives the stall guard's reset
        self.max_occupancy = 0.0
        # Ten frames or 2 s, whichever is longer: enough samples for a slope, recent enough
        # for the guard to see a change of load.
        self.occupancy = OccupancyTracker(window_s=max(2.0, 10 * frame_s))
        self.sample: PoolSample | None = None

    def update(self, t_rel: float, pool: PoolStats, tokens_out: int, frames_owed: int) -> bool:
        """Sample the pool at tick time `t_rel`; True when a stall begins with this tick."""
        was_stalled = self._stall.stalled_now
        stalled = self._stall.update(t_rel, tokens_out, frames_owed, pool.occupancy)
        if stalled and self.first_stall_at is None:
            self.first_stall_at = self._stall.stall_at
        self.max_occupancy = max(self.max_occupancy, pool.occupancy)
        self.sample = PoolSample(self.rank, pool, tokens_out, frames_owed, stalled)
        return stalled and not was_stalled

    @property
    def stall_since(self) -> float | None:
        """The start of the stall in progress (None: not stalled)."""
        return self._stall.stall_at_now

    @property
    def stalled(self) -> bool:
        return self.sample is not None and self.sample.stalled

    @property
    def full(self) -> bool:
        """At the last tick: full enough that a silent frame's cause is memory."""
        return self.sample is not None and self.sample.pool.occupancy >= FULL_OCCUPANCY

    def reset_stall(self) -> None:
        """After the stall guard evicted here: give the pool a chance to flow again."""
        self._stall = StallDetector()

    def slope_per_s(self) -> float | None:
        fit = self.occupancy.fit()
        return None if fit is None else fit.slope_per_s


def memory_signals(cfg: RunConfig, policy: KVPolicy, tracker: OccupancyTracker, t_rel: float,
                   live: int, counted: int | None) -> MemorySignals:
    """What the memory guard weighs on one pool (each rank has `pool_blocks`): ρ now, growth
    per session (fitted over `live` sessions, or from the load's token rate before there is a
    fit), the bounded share per session, the lifetime. `counted`: the sessions the guard
    counts on that pool (None: every session the gate holds)."""
    pool_tokens = cfg.pool_blocks * cfg.block_size
    # The load's own token rate is a floor: an early fit over a window that still holds the
    # empty pool underestimates the slope, and under-estimating is what stalls.
    growth = growth_per_session_per_s(cfg)
    fit = tracker.fit()
    if fit is not None and live > 0:
        growth = max(growth, fit.slope_per_s / live)
    cap = policy.blocks_per_session(cfg.block_size)
    lifetime = cfg.session_s if cfg.session_s else max(0.0, cfg.duration_s - t_rel)
    return MemorySignals(rho_now=min(1.0, max(0.0, tracker.rho_now)),
                         growth_per_session_per_s=growth,
                         plateau_per_session=None if cap is None else cap / cfg.pool_blocks,
                         lifetime_s=lifetime, live=counted)


def growth_per_session_per_s(cfg: RunConfig) -> float:
    """A session's pool growth from the load's token rate (ρ/s of one pool)."""
    return (cfg.tokens_in + cfg.tokens_out - 1) / cfg.frame_s / (
        cfg.pool_blocks * cfg.block_size)
