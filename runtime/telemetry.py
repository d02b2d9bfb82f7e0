"""Per-tick telemetry: the pool sample, tokens out, owed frames, stall detection, the ρ(t) fit
and t_sat, tick overruns; and the memory signals the admission guard weighs.

One `Telemetry` per run, driven from the run thread at every tick. The stall guard's reaction
(evict, then give the pool a fresh detector) is the loop's; the detection is here.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.signals import FULL_OCCUPANCY, STALL_TICKS, OccupancyTracker, StallDetector
from engine.contract import Engine, PoolStats
from runtime.config import RunConfig
from runtime.record import Recorder


class EngineFailed(RuntimeError):
    """The engine reported a fatal error; the run ends as failed with the data so far."""


@dataclass(frozen=True)
class TickSample:
    t_rel: float
    pool: PoolStats
    tokens_out: int
    frames_owed: int
    overrun_ms: float
    stalled: bool


class Telemetry:
    def __init__(self, config: RunConfig, engine: Engine, recorder: Recorder) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self._frame_s = config.frame_ms / 1e3
        self._stall = StallDetector(STALL_TICKS)
        self.first_stall_at: float | None = None  # survives the stall guard's detector reset
        self.occupancy = OccupancyTracker(window_s=max(2.0, 10 * self._frame_s))

    def measure(self, t_rel: float, tokens_out: int, frames_owed: int) -> TickSample:
        """Sample the engine at tick time `t_rel`; raises EngineFailed on a fatal error."""
        tot = self.recorder.totals
        now = self.engine.now()
        # A paced twin keeps virtual time exact; its lag behind the wall clock is the overrun.
        lag_s = max(now - self.recorder.t0 - t_rel, self.engine.wall_lag_s)
        overrun_ms = max(0.0, lag_s * 1e3)
        if overrun_ms > self.config.frame_ms / 2:
            tot.overruns += 1
        tot.max_overrun_ms = max(tot.max_overrun_ms, overrun_ms)
        if self.engine.error():
            raise EngineFailed(self.engine.error())
        pool = self.engine.pool()
        was_stalled = self._stall.stalled_now
        stalled = self._stall.update(t_rel, tokens_out, frames_owed, pool.occupancy)
        if stalled and self.first_stall_at is None:
            self.first_stall_at = self._stall.stall_at
        if stalled and not was_stalled:  # a stall begins: on the record with its cause
            self.recorder.event(t_rel, "stall", since=round(self._stall.stall_at_now, 3),
                                occupancy=round(pool.occupancy, 4), frames_owed=frames_owed,
                                ticks=STALL_TICKS,
                                label=f"pool full, no token for {STALL_TICKS} ticks: "
                                      "silent stall")
        tot.max_occupancy = max(tot.max_occupancy, pool.occupancy)
        self.recorder.pool_full = pool.occupancy >= FULL_OCCUPANCY
        return TickSample(t_rel, pool, tokens_out, frames_owed, overrun_ms, stalled)

    def reset_stall(self) -> None:
        """After the stall guard evicted: give the pool a chance to flow again."""
        self._stall = StallDetector(STALL_TICKS)

    def write_tick(self, k: int, sample: TickSample, *, live: int, limit: int, admitted: int,
                   rejected: int, p95_ms: float | None, n_star: int | None = None) -> None:
        """The tick row (after changes and the guard acted), and the engine's step samples."""
        pool = sample.pool
        policy = self.engine.policy
        self.occupancy.add(sample.t_rel, pool.occupancy)
        fit = self.occupancy.fit()
        rec = self.recorder
        rec.add("ticks", {
            "run_id": rec.run_id, "tick": k, "t": sample.t_rel, "live": live,
            "limit_sessions": limit, "occupancy": pool.occupancy,
            "used_blocks": pool.used_blocks, "total_blocks": pool.total_blocks,
            "running": pool.running, "waiting": pool.waiting, "paused": pool.paused,
            "admitted": admitted, "rejected": rejected, "evicted": rec.totals.evicted,
            "overrun_ms": sample.overrun_ms, "tokens_out": sample.tokens_out,
            "frames_waiting": sample.frames_owed, "stalled": sample.stalled, "p95_ms": p95_ms,
            "n_star": n_star,
            **rec.take_tick_silent(),
            "tsat_s": self.occupancy.t_sat_from_now(),
            "rho_slope_per_s": None if fit is None else fit.slope_per_s,
            "window_tokens": policy.window_tokens, "sink_tokens": policy.sink_tokens})
        steps = self.engine.drain_step_stats()
        for step in steps:
            step["run_id"] = rec.run_id
            step["t"] = step["t"] - rec.t0
        rec.writer.add_many("steps", steps)

    def memory_signals(self, t_rel: float, live: int) -> dict:
        """What the memory guard weighs: ρ now, growth per session (fitted, or from the load's
        token rate before there is a fit), the bounded share per session, the lifetime."""
        cfg = self.config
        pool_tokens = cfg.pool_blocks * cfg.block_size
        # The load's own token rate is a floor: an early fit over a window that still holds
        # the empty pool underestimates the slope, and under-estimating is what stalls.
        growth = (cfg.tokens_in + cfg.tokens_out - 1) / self._frame_s / pool_tokens
        fit = self.occupancy.fit()
        if fit is not None and live > 0:
            growth = max(growth, fit.slope_per_s / live)
        cap = self.engine.policy.blocks_per_session(cfg.block_size)
        plateau = None if cap is None else cap / cfg.pool_blocks
        lifetime = cfg.session_s if cfg.session_s else max(0.0, cfg.duration_s - t_rel)
        return {"rho_now": self.occupancy.rho_now, "growth_per_session_per_s": growth,
                "plateau_per_session": plateau, "lifetime_s": lifetime}
