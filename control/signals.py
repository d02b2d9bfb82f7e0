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


# The one definition of a stall, engine-wide or per rank: a pool at least FULL_OCCUPANCY full,
# frames owed and no token out for STALL_TICKS ticks. Two ticks, not one: a single quiet tick
# is a slow step; record.py's "memory" silence reads the same threshold.
STALL_TICKS = 2
FULL_OCCUPANCY = 0.9


class StallDetector:
    """A stalled pool: occupancy near 1, frames owed, and no token out for `min_ticks` ticks.

    A slow engine is not stalled (tokens still come out), and neither is a quiet pool with room
    to spare. `update` is called once per tick; `stall_at` is the start of the first stall.
    """

    def __init__(self, min_ticks: int = STALL_TICKS,
                 full_occupancy: float = FULL_OCCUPANCY) -> None:
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

    @property
    def stall_at_now(self) -> float | None:
        """Start of the stall in progress (None when not stalled)."""
        return self._quiet_since if self.stalled_now else None


class OccupancyTracker:
    """Live ρ(t) fit over the last `window_s` seconds of samples: slope, t_sat from now."""

    def __init__(self, window_s: float = 5.0, min_samples: int = 5) -> None:
        if window_s <= 0:
            raise ValueError(f"fit window {window_s} s must be > 0")
        self.window_s = window_s
        self.min_samples = min_samples
        self._ts: list[float] = []
        self._rhos: list[float] = []

    def add(self, t: float, rho: float) -> None:
        self._ts.append(t)
        self._rhos.append(rho)
        while self._ts and self._ts[0] < t - self.window_s:
            self._ts.pop(0)
            self._rhos.pop(0)

    @property
    def rho_now(self) -> float:
        return self._rhos[-1] if self._rhos else 0.0

    def fit(self) -> OccupancyFit | None:
        if len(self._ts) < self.min_samples:
            return None
        return fit_occupancy(self._ts, self._rhos)

    def t_sat_from_now(self) -> float | None:
        """Seconds until ρ reaches 1 at the fitted slope; None when not rising."""
        fit = self.fit()
        if fit is None or fit.slope_per_s <= 1e-6 or not self._ts:
            return None
        return max(0.0, (1.0 - self.rho_now) / fit.slope_per_s)
