"""Collapse probability before a run: the twin runs the same settings over many seeds and
counts how often the pool stalls, with a 95 % interval and the median stall time.

Near the race point between pool fill and session length, identical settings collapse on some
seeds and not others (metastable), so "will this load collapse?" is a probability, not a yes or
no. The twin is simulated (milliseconds a run); the answer is as good as its cost model and
block accounting (see docs/BENCHMARKS.md for how it compares with vLLM).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from runtime.config import RunConfig
from runtime.run_summary import RunSummary

logger = logging.getLogger(__name__)

MAX_SEEDS = 5000


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval for k successes in n trials (good at small k and near 0/1,
    where the normal approximation is not)."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"k={k}, n={n}: need n ≥ 1 and 0 ≤ k ≤ n")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class CollapseForecast:
    policy: str  # "unbounded" or "window W=… S=…"
    runs: int
    collapsed: int  # total stall (every session silent)
    partial: int  # memory-caused silence without a total stall
    ci_low: float
    ci_high: float
    median_stall_s: float | None
    median_silent_rate: float
    horizon_s: float
    wall_s: float

    @property
    def rate(self) -> float:
        return self.collapsed / self.runs

    def sentence(self) -> str:
        """What the Experiments page says: 'collapses in 35 % of runs (95 % CI 29–42 %) within
        20 s; median stall at 7.9 s'."""
        text = (f"{self.policy}: collapses in {self.rate:.0%} of runs (95 % CI "
                f"{self.ci_low:.0%}–{self.ci_high:.0%}) within {self.horizon_s:g} s")
        if self.median_stall_s is not None:
            text += f"; median stall at {self.median_stall_s:.1f} s"
        if self.partial:
            text += f"; partial stalls in {self.partial / self.runs:.0%}"
        return text

    def as_dict(self) -> dict:
        return {"policy": self.policy, "runs": self.runs, "collapsed": self.collapsed,
                "collapse_rate": round(self.rate, 4), "ci95": [round(self.ci_low, 4),
                                                              round(self.ci_high, 4)],
                "partial": self.partial, "median_stall_s": self.median_stall_s,
                "median_silent_rate": self.median_silent_rate, "horizon_s": self.horizon_s,
                "wall_s": round(self.wall_s, 2), "sentence": self.sentence()}


def forecast(config: RunConfig, seeds: int = 200, cost=None,
             progress: Callable[[float], None] | None = None) -> CollapseForecast:
    """Run `config` on the twin (unpaced) for seeds config.seed … config.seed + seeds − 1 and
    count the collapses. `cost`: the twin's CostModel (None: the latest fitted, else default)."""
    from engine import create_engine
    from runtime.drive import run_series
    from store import Store

    if not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(f"seeds {seeds} must be in [1, {MAX_SEEDS}]")
    base = replace(config, engine="twin", paced=False, changes=())
    store = Store(":memory:")  # private: the forecast's runs are not the operator's history
    started = time.perf_counter()
    done = 0

    def after(_summary: RunSummary) -> None:
        nonlocal done
        done += 1
        store.drop_bulk_rows()  # each run's rows are only needed for its own summary
        if progress is not None:
            progress(done / seeds)

    try:
        summaries = run_series(
            (replace(base, seed=config.seed + i) for i in range(seeds)), store,
            engine_factory=lambda cfg, _store: create_engine("twin", cfg.engine_config(), cost),
            after=after)
    finally:
        store.close()
    stalls = [s.stall_at_s for s in summaries if s.stalled]
    low, high = wilson_interval(len(stalls), seeds)
    policy = base.kv_policy().label
    result = CollapseForecast(
        policy, seeds, len(stalls), sum(1 for s in summaries if s.partial_stall), low,
        high, statistics.median(stalls) if stalls else None,
        statistics.median(s.silent_rate or 0.0 for s in summaries), base.duration_s,
        time.perf_counter() - started)
    logger.info("forecast %s over %d seeds in %.1f s", result.sentence(), seeds, result.wall_s)
    return result


def forecast_pair(config: RunConfig, window: int, sinks: int = 0, seeds: int = 200, cost=None,
                  progress: Callable[[float], None] | None = None
                  ) -> tuple[CollapseForecast, CollapseForecast]:
    """The settings as given with unbounded KV and with a window, side by side."""
    def part(offset: float):
        return None if progress is None else (lambda f: progress(offset + f / 2))

    unbounded = forecast(replace(config, policy="unbounded", window=None, sinks=0), seeds,
                         cost, part(0.0))
    windowed = forecast(replace(config, policy="window", window=window, sinks=sinks), seeds,
                        cost, part(0.5))
    return unbounded, windowed
