"""Per-tick telemetry: the pool samples, stall detection, the ρ(t) fit and t_sat, tick overruns,
the tick rows; and what placement and the memory guard weigh.

One `Telemetry` per run, driven from the run thread at every tick. It keeps one PoolMonitor per
data-parallel rank (runtime/pools.py); an engine with one rank is a fleet of one, whose monitor
is the whole engine's. With more ranks each rank has its own pool and a session lives on one,
so the engine-wide occupancy can read 0.5 while one rank is full and silent: the engine-wide
row is derived from the ranks (stalled when any rank is), and each rank writes a `rank_ticks`
row. The stall guard's reaction (evict, then reset that pool's detector) is the loop's; the
detection is here.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.placement import RankLoad
from control.signals import FULL_OCCUPANCY, STALL_TICKS, OccupancyTracker
from engine.contract import Engine, PoolStats
from runtime.config import RunConfig
from runtime.pools import (PoolMonitor, PoolSample, TickCounts, growth_per_session_per_s,
                           memory_signals)
from runtime.record import Recorder
from runtime.run_summary import RankSummary
from runtime.tick_rows import RankTickRow, TickRow

__all__ = ["EngineFailed", "Telemetry", "TickSample"]


class EngineFailed(RuntimeError):
    """The engine reported a fatal error; the run ends as failed with the data so far."""


@dataclass(frozen=True)
class TickSample:
    t_rel: float
    pool: PoolStats  # the whole engine's
    tokens_out: int
    frames_owed: int
    overrun_ms: float
    stalled: bool  # any rank's pool
    ranks: tuple[PoolSample, ...]


class Telemetry:
    def __init__(self, config: RunConfig, engine: Engine, recorder: Recorder) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.n = engine.ranks
        frame_s = config.frame_s
        self.monitors = [PoolMonitor(rank, frame_s) for rank in range(self.n)]
        # The engine-wide ρ(t) fit: a fleet of one's own; with more ranks, the summed pool's.
        self.occupancy = (self.monitors[0].occupancy if self.n == 1
                          else OccupancyTracker(window_s=max(2.0, 10 * frame_s)))

    @property
    def ranked(self) -> bool:
        """More than one pool: rank rows, rank-named stalls, placement and per-rank guards."""
        return self.n > 1

    @property
    def first_stall_at(self) -> float | None:
        """When the first pool stalled (a stalled rank is a stall, whatever the mean reads)."""
        return min((m.first_stall_at for m in self.monitors if m.first_stall_at is not None),
                   default=None)

    def _pools(self) -> list[PoolStats]:
        pools = self.engine.pool_ranks()
        if len(pools) != self.n:
            raise RuntimeError(f"the engine reported {len(pools)} rank pools; it has {self.n}")
        return pools

    # --- per tick -----------------------------------------------------------------------------
    def measure(self, t_rel: float, counts: TickCounts) -> TickSample:
        """Sample the engine at tick time `t_rel`; raises EngineFailed on a fatal error."""
        rec = self.recorder
        tot = rec.totals
        now = self.engine.now()
        # A paced twin keeps virtual time exact; its lag behind the wall clock is the overrun.
        lag_s = max(now - rec.t0 - t_rel, self.engine.wall_lag_s)
        overrun_ms = max(0.0, lag_s * 1e3)
        if overrun_ms > self.config.frame_ms / 2:
            tot.overruns += 1
        tot.max_overrun_ms = max(tot.max_overrun_ms, overrun_ms)
        if self.engine.error():
            raise EngineFailed(self.engine.error())
        # One rank: its pool is the engine's. More: the engine's own sum (it knows where the
        # sessions it placed are paused; the ranks do not).
        pools = [self.engine.pool()] if self.n == 1 else self._pools()
        whole = pools[0] if self.n == 1 else self.engine.pool()
        for monitor, pool in zip(self.monitors, pools):
            tokens, owed = counts.on(monitor.rank, self.n)
            if monitor.update(t_rel, pool, tokens, owed):
                self._stall_event(t_rel, monitor)
            # A silent frame's cause is its own rank's pool, not the engine-wide mean.
            rec.pool_full[monitor.rank] = monitor.full
        rec.pool_full[None] = whole.occupancy >= FULL_OCCUPANCY  # frames of an unknown rank
        tot.max_occupancy = max(tot.max_occupancy, whole.occupancy)
        samples = tuple(m.sample for m in self.monitors)
        return TickSample(t_rel, whole, counts.tokens_out, counts.frames_owed, overrun_ms,
                          any(s.stalled for s in samples), samples)

    def _stall_event(self, t_rel: float, monitor: PoolMonitor) -> None:
        s = monitor.sample
        where = {"rank": monitor.rank} if self.ranked else {}
        named = f"rank {monitor.rank}: " if self.ranked else ""
        self.recorder.event(t_rel, "stall", **where, since=round(monitor.stall_since, 3),
                            occupancy=round(s.pool.occupancy, 4), frames_owed=s.frames_owed,
                            ticks=STALL_TICKS,
                            label=f"{named}pool full, no token for {STALL_TICKS} ticks: "
                                  "silent stall")

    def stalled_ranks(self) -> list[int]:
        return [m.rank for m in self.monitors if m.stalled]

    def reset_stall(self, rank: int) -> None:
        """After the stall guard evicted on `rank`: give its pool a chance to flow again."""
        self.monitors[rank].reset_stall()

    def write_tick(self, k: int, sample: TickSample, *, live: int, live_by_rank: dict,
                   limit: int, admitted: int, rejected: int, p95_ms: float | None,
                   n_star: int | None = None) -> None:
        """The tick row and the rank rows (after changes and the guard acted), and the
        engine's step samples."""
        pool = sample.pool
        policy = self.engine.policy
        rec = self.recorder
        if self.ranked:
            self.occupancy.add(sample.t_rel, pool.occupancy)
        for monitor in self.monitors:
            monitor.occupancy.add(sample.t_rel, monitor.sample.pool.occupancy)
        fit = self.occupancy.fit()
        rec.add("ticks", TickRow(
            run_id=rec.run_id, tick=k, t=sample.t_rel, live=live,
            limit_sessions=limit, occupancy=pool.occupancy,
            used_blocks=pool.used_blocks, total_blocks=pool.total_blocks,
            running=pool.running, waiting=pool.waiting, paused=pool.paused,
            admitted=admitted, rejected=rejected, evicted=rec.totals.evicted,
            overrun_ms=sample.overrun_ms, tokens_out=sample.tokens_out,
            frames_waiting=sample.frames_owed, stalled=sample.stalled, p95_ms=p95_ms,
            n_star=n_star,
            **rec.take_tick_silent(),
            tsat_s=self.occupancy.t_sat_from_now(),
            rho_slope_per_s=None if fit is None else fit.slope_per_s,
            window_tokens=policy.window_tokens, sink_tokens=policy.sink_tokens).as_row())
        if self.ranked:
            self._write_ranks(k, sample.t_rel, live_by_rank)
        # vars(), not asdict(): asdict deep-copies every field, a tick's largest cost on the
        # run thread while it holds the GIL (issue 39's profile); the fields are numbers.
        rec.writer.add_many("steps", [
            {**vars(step), "t": step.t - rec.t0, "run_id": rec.run_id}
            for step in self.engine.drain_step_stats()])

    def _write_ranks(self, k: int, t_rel: float, live_by_rank: dict) -> None:
        rec = self.recorder
        for monitor in self.monitors:
            s = monitor.sample
            frames, silent = rec.take_rank_tick(s.rank)
            rec.add("rank_ticks", RankTickRow(
                run_id=rec.run_id, tick=k, t=t_rel, rank=s.rank,
                live=live_by_rank.get(s.rank, 0), occupancy=s.pool.occupancy,
                used_blocks=s.pool.used_blocks, total_blocks=s.pool.total_blocks,
                running=s.pool.running, waiting=s.pool.waiting, paused=s.pool.paused,
                tokens_out=s.tokens_out, frames_waiting=s.frames_owed,
                stalled=s.stalled, frames=frames, silent_frames=silent,
                tsat_s=monitor.occupancy.t_sat_from_now(),
                rho_slope_per_s=monitor.slope_per_s()).as_row())

    # --- what placement and the guards weigh --------------------------------------------------
    def loads(self, live_by_rank: dict) -> list[RankLoad]:
        """Each rank now: its pool (read fresh: arrivals fall between ticks), live sessions,
        fitted slope."""
        return [RankLoad(m.rank, min(1.0, max(0.0, pool.occupancy)),
                         live_by_rank.get(m.rank, 0), m.slope_per_s())
                for m, pool in zip(self.monitors, self._pools())]

    def growth_per_session_per_s(self) -> float:
        return growth_per_session_per_s(self.config)

    def plateau_per_session(self) -> float | None:
        cap = self.engine.policy.blocks_per_session(self.config.block_size)
        return None if cap is None else cap / self.config.pool_blocks

    def memory_signals(self, rank: int, t_rel: float, live_here: int):
        """The memory guard's inputs for the pool a session would join: `rank`'s, with
        `live_here` sessions on it. A fleet of one counts every session the gate holds (an
        admitted remote client not yet open holds room too)."""
        return memory_signals(self.config, self.engine.policy,
                              self.monitors[rank].occupancy, t_rel, live_here,
                              live_here if self.ranked else None)

    # --- the summary --------------------------------------------------------------------------
    def summary(self) -> dict:
        """The summary's rank fields: per rank (RankSummary) max occupancy, whether and when it
        stalled, its frames and silent frames; the first rank to stall."""
        rec = self.recorder
        ranks = tuple(RankSummary(
            m.rank, round(m.max_occupancy, 4), m.first_stall_at is not None,
            None if m.first_stall_at is None else round(m.first_stall_at, 3),
            rec.rank_frames.get(m.rank, 0), rec.rank_silent.get(m.rank, 0))
            for m in self.monitors)
        stalled = [(r.stall_at_s, r.rank) for r in ranks if r.stall_at_s is not None]
        return {"ranks": ranks, "stalled_rank": min(stalled)[1] if stalled else None,
                "data_parallel_size": self.n}
