"""Per-rank telemetry for data-parallel engines: each rank's pool, ρ(t) fit, t_sat, stall
detection and silent frames, and what placement and the guards weigh per rank.

With data parallelism each rank has its own KV pool and a session lives on one rank, so the
engine-wide occupancy (the `ticks` row) can read 0.5 while one rank is full and silent. This
module keeps one detector and one ρ(t) fit per rank and writes one `rank_ticks` row per rank
per tick. A single-rank engine needs none of it: `active` is False and the run reads exactly as
before (its one rank is the aggregate).
"""

from __future__ import annotations

from dataclasses import dataclass

from control.placement import RankLoad
from control.signals import FULL_OCCUPANCY, STALL_TICKS, OccupancyTracker, StallDetector
from engine.contract import Engine, PoolStats
from runtime.config import RunConfig
from runtime.record import Recorder


@dataclass(frozen=True)
class RankSample:
    rank: int
    pool: PoolStats
    tokens_out: int
    frames_owed: int
    stalled: bool


class RankTelemetry:
    def __init__(self, config: RunConfig, engine: Engine, recorder: Recorder) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.n = engine.ranks
        self.active = self.n > 1
        self._frame_s = config.frame_ms / 1e3
        self._stall = [StallDetector(STALL_TICKS) for _ in range(self.n)]
        self.first_stall_at: list[float | None] = [None] * self.n
        self.max_occupancy = [0.0] * self.n
        self.occupancy = [OccupancyTracker(window_s=max(2.0, 10 * self._frame_s))
                          for _ in range(self.n)]
        self.samples: list[RankSample] = []

    def _pools(self) -> list[PoolStats]:
        pools = self.engine.pool_ranks()
        if len(pools) != self.n:
            raise RuntimeError(f"the engine reported {len(pools)} rank pools; it has {self.n}")
        return pools

    # --- per tick -----------------------------------------------------------------------------
    def measure(self, t_rel: float, tokens_by_rank: dict, owed_by_rank: dict) -> list[RankSample]:
        """Sample every rank's pool and run its stall detector (nothing with one rank)."""
        if not self.active:
            return []
        samples = []
        for rank, pool in enumerate(self._pools()):
            detector = self._stall[rank]
            was_stalled = detector.stalled_now
            tokens, owed = tokens_by_rank.get(rank, 0), owed_by_rank.get(rank, 0)
            stalled = detector.update(t_rel, tokens, owed, pool.occupancy)
            if stalled and self.first_stall_at[rank] is None:
                self.first_stall_at[rank] = detector.stall_at
            if stalled and not was_stalled:
                self.recorder.event(
                    t_rel, "stall", rank=rank, since=round(detector.stall_at_now, 3),
                    occupancy=round(pool.occupancy, 4), frames_owed=owed, ticks=STALL_TICKS,
                    label=f"rank {rank}: pool full, no token for {STALL_TICKS} ticks: "
                          "silent stall")
            self.max_occupancy[rank] = max(self.max_occupancy[rank], pool.occupancy)
            # A silent frame's cause is its own rank's pool, not the engine-wide mean.
            self.recorder.rank_full[rank] = pool.occupancy >= FULL_OCCUPANCY
            samples.append(RankSample(rank, pool, tokens, owed, stalled))
        self.samples = samples
        return samples

    @property
    def stalled_ranks(self) -> list[int]:
        return [s.rank for s in self.samples if s.stalled]

    def reset_stall(self, rank: int) -> None:
        """After the stall guard evicted on `rank`: give its pool a chance to flow again."""
        self._stall[rank] = StallDetector(STALL_TICKS)

    def write(self, k: int, t_rel: float, live_by_rank: dict) -> None:
        """One rank_ticks row per rank (after the guard acted) and each rank's ρ(t) fit."""
        rec = self.recorder
        rows = []
        for s in self.samples:
            tracker = self.occupancy[s.rank]
            tracker.add(t_rel, s.pool.occupancy)
            fit = tracker.fit()
            frames, silent = rec.take_rank_tick(s.rank)
            rows.append({
                "run_id": rec.run_id, "tick": k, "t": t_rel, "rank": s.rank,
                "live": live_by_rank.get(s.rank, 0), "occupancy": s.pool.occupancy,
                "used_blocks": s.pool.used_blocks, "total_blocks": s.pool.total_blocks,
                "running": s.pool.running, "waiting": s.pool.waiting, "paused": s.pool.paused,
                "tokens_out": s.tokens_out, "frames_waiting": s.frames_owed,
                "stalled": s.stalled, "frames": frames, "silent_frames": silent,
                "tsat_s": tracker.t_sat_from_now(),
                "rho_slope_per_s": None if fit is None else fit.slope_per_s})
        for row in rows:
            rec.add("rank_ticks", row)

    # --- what placement and the guards weigh --------------------------------------------------
    def growth_per_session_per_s(self) -> float:
        """A session's pool growth on its rank from the load's token rate (ρ/s)."""
        cfg = self.config
        return (cfg.tokens_in + cfg.tokens_out - 1) / self._frame_s / (
            cfg.pool_blocks * cfg.block_size)

    def plateau_per_session(self) -> float | None:
        cap = self.engine.policy.blocks_per_session(self.config.block_size)
        return None if cap is None else cap / self.config.pool_blocks

    def loads(self, live_by_rank: dict) -> list[RankLoad]:
        """Each rank now: its pool (read fresh: arrivals fall between ticks), live sessions,
        fitted slope."""
        loads = []
        for rank, pool in enumerate(self._pools()):
            fit = self.occupancy[rank].fit()
            loads.append(RankLoad(rank, min(1.0, max(0.0, pool.occupancy)),
                                  live_by_rank.get(rank, 0),
                                  None if fit is None else fit.slope_per_s))
        return loads

    def memory_signals(self, rank: int, t_rel: float, live_on_rank: int) -> dict:
        """The memory guard's inputs for the rank a session would land on (as
        Telemetry.memory_signals for the whole pool; each rank has pool_blocks)."""
        cfg = self.config
        growth = self.growth_per_session_per_s()
        tracker = self.occupancy[rank]
        fit = tracker.fit()
        if fit is not None and live_on_rank > 0:
            growth = max(growth, fit.slope_per_s / live_on_rank)
        lifetime = cfg.session_s if cfg.session_s else max(0.0, cfg.duration_s - t_rel)
        return {"rho_now": tracker.rho_now, "live": live_on_rank,
                "growth_per_session_per_s": growth,
                "plateau_per_session": self.plateau_per_session(), "lifetime_s": lifetime}

    # --- the summary --------------------------------------------------------------------------
    def summary(self, stall_at: float | None) -> list[dict]:
        """Per rank: max occupancy, whether and when it stalled, its silent frames. One rank:
        the engine-wide figures (it is the whole pool)."""
        rec = self.recorder
        if not self.active:
            return [{"rank": 0, "max_occupancy": round(rec.totals.max_occupancy, 4),
                     "stalled": stall_at is not None,
                     "stall_at_s": None if stall_at is None else round(stall_at, 3),
                     "frames": rec.totals.frames, "silent_frames": rec.totals.silent}]
        return [{"rank": r, "max_occupancy": round(self.max_occupancy[r], 4),
                 "stalled": self.first_stall_at[r] is not None,
                 "stall_at_s": None if self.first_stall_at[r] is None
                 else round(self.first_stall_at[r], 3),
                 "frames": rec.rank_frames.get(r, 0), "silent_frames": rec.rank_silent.get(r, 0)}
                for r in range(self.n)]


def first_stall(ranks: list[dict]) -> tuple[int | None, float | None]:
    """The rank that stalled first and when (None, None: no rank stalled)."""
    stalled = [(r["stall_at_s"], r["rank"]) for r in ranks if r["stall_at_s"] is not None]
    if not stalled:
        return None, None
    at, rank = min(stalled)
    return rank, at
