"""Signals from telemetry: percentiles, the pool-fill fit ρ(t) = ρ0 + slope·t, t_sat, stalls."""

from __future__ import annotations

import math
from dataclasses import dataclass


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 1]), None for no values; same as quantile_cont."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} must be in [0, 1]")
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class OccupancyFit:
    rho0: float
    slope_per_s: float
    n: int

    def t_sat(self) -> float | None:
        """Time (same origin as the samples) at which ρ reaches 1; None if not rising."""
        if self.slope_per_s <= 1e-9:
            return None
        return (1.0 - self.rho0) / self.slope_per_s


def fit_occupancy(ts: list[float], rhos: list[float]) -> OccupancyFit | None:
    """Least-squares line through (t, ρ) samples; None with fewer than 3 distinct times."""
    if len(ts) != len(rhos):
        raise ValueError(f"{len(ts)} times but {len(rhos)} occupancy samples")
    if len(set(ts)) < 3:
        return None
    n = len(ts)
    mt, mr = sum(ts) / n, sum(rhos) / n
    var = sum((t - mt) ** 2 for t in ts)
    slope = sum((t - mt) * (r - mr) for t, r in zip(ts, rhos)) / var
    return OccupancyFit(mr - slope * mt, slope, n)


def predict_t_sat(ts: list[float], rhos: list[float], fraction: float = 1 / 3) -> float | None:
    """Predict when the pool fills, from the first `fraction` of the fill.

    The fill is the stretch from the first non-zero sample to the first sample at ρ ≥ 0.99 (or
    the end). Fitting on its first third is the honest test: the prediction is made long before
    the wall, as the console would make it live.
    """
    start = next((i for i, r in enumerate(rhos) if r > 0), None)
    if start is None:
        return None
    end = next((i for i, r in enumerate(rhos) if r >= 0.99), len(rhos) - 1)
    span = ts[end] - ts[start]
    if span <= 0:
        return None
    cut = ts[start] + fraction * span
    idx = [i for i in range(start, end + 1) if ts[i] <= cut]
    fit = fit_occupancy([ts[i] for i in idx], [rhos[i] for i in idx])
    return fit.t_sat() if fit else None


class StallDetector:
    """A stalled pool: occupancy near 1, frames owed, and no token out for `min_ticks` ticks.

    A slow engine is not stalled (tokens still come out), and neither is a quiet pool with room
    to spare. `update` is called once per tick; `stall_at` is the start of the first stall.
    """

    def __init__(self, min_ticks: int = 3, full_occupancy: float = 0.9) -> None:
        if min_ticks < 1:
            raise ValueError(f"min ticks {min_ticks} must be ≥ 1")
        if not 0 < full_occupancy <= 1:
            raise ValueError(f"full occupancy {full_occupancy} must be in (0, 1]")
        self.min_ticks = min_ticks
        self.full_occupancy = full_occupancy
        self._quiet_since: float | None = None
        self._quiet_ticks = 0
        self.stalled_now = False
        self.stall_at: float | None = None

    def update(self, t: float, tokens_out: int, frames_waiting: int, occupancy: float) -> bool:
        if tokens_out > 0 or frames_waiting == 0 or occupancy < self.full_occupancy:
            self._quiet_since, self._quiet_ticks, self.stalled_now = None, 0, False
            return False
        if self._quiet_since is None:
            self._quiet_since = t
        self._quiet_ticks += 1
        self.stalled_now = self._quiet_ticks >= self.min_ticks
        if self.stalled_now and self.stall_at is None:
            self.stall_at = self._quiet_since
        return self.stalled_now
