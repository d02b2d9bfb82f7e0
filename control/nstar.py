"""N*: the live count the admission controller held at the latency target.

Fed one control sample per interval (the same samples the limit sees), it keeps the run's
*stable stretches*: maximal runs of consecutive samples in which

- the controller is engaged: it binds (live ≥ cap − 1: the cap, not a thin offered load, holds
  live there) or the sample is over the target (the controller is cutting); and the cap is below
  its ceiling (a cap stuck at the most sessions a run offers measures the offer, not the
  machine);
- live varies by at most `spread` (1) across the stretch.

A stretch is *at the target* when its median p95 is: at most half of its samples are over
target · (1 + tolerance), 5 % by default (a censored p95, a silent frame's unknown latency, is
always over). Judged per stretch, not per sample: a controller that holds a real engine at its
target sits on it, so single intervals fall on both sides (on vLLM, 2 cores, requiring every
sample under it never found a stretch: benchmarks/n_star_discovery.py prints the spread).

A stretch counts once it is `min_intervals` long and at the target. N* is the median live count
of the last stretch that counts (rounded half up), `at_s` when that stretch began, `for_s` how
long it lasted. While the current stretch counts, it is the last one: N* follows a run that
settles.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.05  # p95 within 5 % over the target still counts as "at" it
DEFAULT_MIN_INTERVALS = 5


@dataclass(frozen=True)
class NStar:
    n_star: int
    at_s: float  # run-relative start of the stretch it was held over
    for_s: float  # how long the stretch lasted (first to last sample)
    intervals: int


class _Stretch:
    """One stretch: its live counts (for the median) and its latest runs of equal live counts
    (to hand a suffix on when live moves), bounded so a week-long run stays small."""

    RECENT_RUNS = 256

    def __init__(self, samples=()) -> None:
        self.counts: Counter = Counter()
        self.runs: deque = deque(maxlen=self.RECENT_RUNS)  # [live, samples, first t, over]
        self.first_t = self.last_t = 0.0
        self.n = 0
        self.over = 0  # samples over the target
        for t, live, count, over in samples:
            self.add(t, live, over, count)

    def add(self, t: float, live: int, over: int, count: int = 1) -> None:
        if self.n == 0:
            self.first_t = t
        self.n += count
        self.over += over
        self.last_t = max(self.last_t, t)
        self.counts[live] += count
        if self.runs and self.runs[-1][0] == live:
            self.runs[-1][1] += count
            self.runs[-1][3] += over
        else:
            self.runs.append([live, count, t, over])

    @property
    def at_target(self) -> bool:
        """The median sample is at the target: at most half are over it."""
        return 2 * self.over <= self.n

    def spread_with(self, live: int) -> int:
        return max(max(self.counts, default=live), live) - min(min(self.counts, default=live), live)

    def suffix_within(self, live: int, spread: int) -> "_Stretch":
        """The latest samples that agree with `live` within `spread`, as a stretch of its own."""
        kept: list = []
        for run in reversed(self.runs):
            values = [r[0] for r in kept] + [run[0], live]
            if max(values) - min(values) > spread:
                break
            kept.insert(0, run)
        return _Stretch((first_t, value, count, over) for value, count, first_t, over in kept)

    def median(self) -> float:
        half, seen = self.n / 2, 0
        ordered = sorted(self.counts.items())
        for i, (value, count) in enumerate(ordered):
            seen += count
            if seen > half:
                return float(value)
            if seen == half:  # even count, split between this value and the next
                return (value + ordered[i + 1][0]) / 2
        raise AssertionError("median of an empty stretch")


class NStarTracker:
    """Online N* over a run's control samples; `value` is None until a stretch counts."""

    def __init__(self, ceiling: int, tolerance: float = DEFAULT_TOLERANCE,
                 min_intervals: int = DEFAULT_MIN_INTERVALS, spread: int = 1) -> None:
        if ceiling < 1:
            raise ValueError(f"cap ceiling {ceiling} must be ≥ 1")
        if not 0 <= tolerance <= 1:
            raise ValueError(f"N* tolerance {tolerance} must be in [0, 1] of the target")
        if not 2 <= min_intervals <= 10_000:
            raise ValueError(f"N* stretch of {min_intervals} intervals must be in [2, 10000]")
        if not 0 <= spread <= 8:
            raise ValueError(f"N* live spread {spread} must be in [0, 8]")
        self.ceiling = ceiling
        self.tolerance = tolerance
        self.min_intervals = min_intervals
        self.spread = spread
        self._stretch = _Stretch()
        self._last: NStar | None = None

    @property
    def value(self) -> NStar | None:
        current = self._settled()
        return current if current is not None else self._last

    def add(self, t_s: float, live: int, cap: int, p95_ms: float, target_ms: float) -> None:
        """One control sample: its p95 (math.inf when censored), the live count and the cap
        the limit set from it, and the latency target in force."""
        if target_ms <= 0:
            raise ValueError(f"target {target_ms} ms must be > 0")
        over = not (math.isfinite(p95_ms) and p95_ms <= target_ms * (1 + self.tolerance))
        engaged = live > 0 and cap < self.ceiling and (live >= cap - 1 or over)
        if not engaged:
            self._close(_Stretch())
        elif self._stretch.spread_with(live) <= self.spread:
            self._stretch.add(t_s, live, int(over))
        else:
            # Live moved: the stretch ends; the next one starts with the latest samples that
            # agree with this one (a settle that drifts by one keeps its recent history).
            following = self._stretch.suffix_within(live, self.spread)
            following.add(t_s, live, int(over))
            self._close(following)

    def _close(self, following: _Stretch) -> None:
        settled = self._settled()
        if settled is not None:
            self._last = settled
        self._stretch = following

    def _settled(self) -> NStar | None:
        stretch = self._stretch
        if stretch.n < self.min_intervals or not stretch.at_target:
            return None
        return NStar(math.floor(stretch.median() + 0.5), round(stretch.first_t, 3),
                     round(stretch.last_t - stretch.first_t, 3), stretch.n)


def n_star_of(samples, ceiling: int, **kwargs) -> NStar | None:
    """N* of recorded samples: (t_s, live, cap, p95_ms, target_ms) in time order."""
    tracker = NStarTracker(ceiling, **kwargs)
    for sample in samples:
        tracker.add(*sample)
    return tracker.value
