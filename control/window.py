"""The control sample a Limit sees: frames aggregated per control interval over a sliding
window (p95 latency, and whether too many went silent)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from control.limits import Limit
from control.signals import percentile

# A control sample with more silent frames than this share is a drop: the same rule that says a
# calibration probe is served (services/calibration.py), so the cap is judged as N_c is.
MAX_SILENT_SHARE = 0.01
# A window holds at least this many ticks at any frame period: what 3 s holds at 80 ms, the
# period the defaults were tuned at (at 160 ms 3 s is 19 ticks, whose p95 is within one tick
# of the slowest: N* discovery on vLLM held a median 0.88 of a 20 s load's N_c, 0.93 with 6 s).
MIN_WINDOW_TICKS = 36


def window_intervals(window_s: float, interval_s: float, frame_s: float) -> int:
    """Control intervals a window spans: window_s, and at least MIN_WINDOW_TICKS frames."""
    return min(600, max(1, round(window_s / interval_s),
                        math.ceil(MIN_WINDOW_TICKS * frame_s / interval_s - 1e-9)))


class WindowedLimit:
    """Feeds a Limit one sample per control interval, judged over the frames of the last
    `window_intervals` intervals (a sliding window; 1: the interval alone): their p95 frame
    latency, and `dropped` when more than `max_silent_share` of them went silent (0.0: any).
    Samples with fewer than `min_samples` frames and no silent one are skipped (too little to
    say anything). The clock is whatever `now` callers pass.

    Why a window longer than the interval: at 80 ms frames a 1 s interval holds 12.5 ticks, so
    one slow tick (a session opening, a noisy neighbour) is 8 % of its frames and moves its p95
    by itself, and one silent frame in ~100 is a "drop". Judged over 3 s the same tick is 2.7 %
    and a drop means more than 1 % silent, the rule N_c is calibrated by; a sustained overload
    still shows within one interval (a p95 crosses once 5 % of the window is over). After a cut
    the window starts again, and while live is at or over the cap the next sample waits until
    it is full."""

    def __init__(self, limit_of: Callable[[], Limit], interval_s: float = 1.0, min_samples: int = 10,
                 window_intervals: int = 1, max_silent_share: float = 0.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"control interval {interval_s} s must be > 0")
        if min_samples < 1:
            raise ValueError(f"minimum sample count {min_samples} must be ≥ 1")
        if not 1 <= window_intervals <= 600:
            raise ValueError(f"control window of {window_intervals} intervals must be in "
                             "[1, 600]")
        if not 0 <= max_silent_share < 1:
            raise ValueError(f"silent share {max_silent_share} must be in [0, 1)")
        # The limit in force, read from its owner (the run's live settings) at each sample: a
        # swapped limit gets the window's samples so far.
        self._limit_of = limit_of
        self.interval_s = interval_s
        self.min_samples = min_samples
        self.max_silent_share = max_silent_share
        self._start: float | None = None
        self._latencies: list[float] = []
        self._silent = 0
        # The closed intervals still in the window: (latencies, silent count).
        self._closed: deque[tuple[list[float], int]] = deque(maxlen=window_intervals)
        self._cut = False  # a cut was made and the window has not refilled since
        self.last_p95_ms: float | None = None

    @property
    def inner(self) -> Limit:
        return self._limit_of()

    @property
    def limit(self) -> int:
        return self.inner.limit

    def add(self, now: float, latency_ms: float, silent: bool) -> None:
        if self._start is None:
            self._start = now
        self._latencies.append(latency_ms)
        self._silent += bool(silent)

    def maybe_sample(self, now: float, inflight: int) -> bool:
        """Close the interval if it is over; True when the inner limit got a sample."""
        if self._start is None or now - self._start < self.interval_s:
            return False
        self._closed.append((self._latencies, self._silent))
        self._start, self._latencies, self._silent = now, [], 0
        if self._cut and len(self._closed) < self._closed.maxlen:
            if inflight >= self.inner.limit:
                return False  # after a cut: no sample until the window holds only later frames
            # ... unless sessions left and the cap would admit again: then the frames since
            # the cut decide (admitting on the cut's word alone put arrivals into an overload
            # on vLLM: 1.4-1.7 % of a run's frames silent against 0.5-1.1 % judging at once).
        else:
            self._cut = False
        samples = [x for latencies, _ in self._closed for x in latencies]
        silent = sum(count for _, count in self._closed)
        if len(samples) < self.min_samples and not silent:
            return False
        dropped = silent > self.max_silent_share * len(samples)
        p95 = percentile(samples, 0.95) if samples else math.inf
        self.last_p95_ms = p95
        before = self.inner.limit
        self.inner.on_sample(now, p95, inflight, dropped)
        if self.inner.limit < before:
            # One cut per window (TCP's one cut per round trip): the frames from before the cut
            # leave the window, and the next sample waits for a whole window of frames the new
            # cap could have shaped. Kept, they read as over the target a while longer and
            # each anchored cut follows live down (on the twin AIMD then held live ~10 % under
            # N*); judged at once on one interval, a single interval's spikes are back.
            self._closed.clear()
            self._cut = True
        return True
