import math

import pytest

from control.nstar import NStarTracker, n_star_of

TARGET_MS = 40.0


def samples(lives, caps=None, p95=39.0, t0=0.0):
    caps = caps or lives
    return [(t0 + i, n, c, p95, TARGET_MS) for i, (n, c) in enumerate(zip(lives, caps))]


def test_n_star_is_the_median_live_count_of_the_last_stable_stretch_at_the_target():
    climb = samples(range(1, 16))  # live moves by one per interval: never stable
    held = samples([20, 19, 20, 20, 19, 20, 20], t0=15.0)
    found = n_star_of(climb + held, ceiling=64)
    assert found is not None and found.n_star == 20
    assert found.at_s == 15.0 and found.for_s == 6.0 and found.intervals == 7
    assert n_star_of(climb, ceiling=64) is None


def test_a_stretch_needs_the_cap_to_bind_latency_at_target_and_enough_intervals():
    # The offer is thin: live sits 3 under the cap (the cap is not what holds it).
    assert n_star_of(samples([10] * 10, caps=[13] * 10), ceiling=64) is None
    # Over target by more than the tolerance, or censored: not "at the target".
    assert n_star_of(samples([20] * 10, p95=42.5), ceiling=64) is None
    assert n_star_of(samples([20] * 10, p95=math.inf), ceiling=64) is None
    assert n_star_of(samples([20] * 10, p95=41.9), ceiling=64).n_star == 20  # within 5 %
    # A cap at the ceiling (every offered session) measures the offer, not the machine.
    assert n_star_of(samples([20] * 10), ceiling=20) is None
    assert n_star_of(samples([20] * 4), ceiling=64) is None  # too short


def test_the_last_stretch_wins_and_survives_an_unstable_end():
    first = samples([12] * 6)
    second = samples([18] * 8, t0=10.0)
    tail = samples([30, 5, 30], p95=70.0, t0=20.0)  # the end of the run falls apart
    found = n_star_of(first + second + tail, ceiling=64)
    assert found.n_star == 18 and found.at_s == 10.0


def test_a_drift_by_one_keeps_the_recent_history():
    tracker = NStarTracker(ceiling=64)
    for s in samples([20, 20, 20, 21, 21, 21, 22, 22]):
        tracker.add(*s)
    # 20..21 was a stretch of 6; 22 starts a new one with the 21s: 21, 21, 21, 22, 22.
    value = tracker.value
    assert value.n_star == 21 and value.at_s == 3.0 and value.intervals == 5


def test_tracker_config_names_the_bad_value():
    with pytest.raises(ValueError, match="tolerance 2"):
        NStarTracker(64, tolerance=2)
    with pytest.raises(ValueError, match="stretch of 1 intervals"):
        NStarTracker(64, min_intervals=1)
    with pytest.raises(ValueError, match="ceiling 0"):
        NStarTracker(0)


def test_a_controller_that_sits_on_the_target_settles_although_single_intervals_go_over():
    # What vLLM on 2 cores looks like at a steady live count: the p95 swings around the target
    # from one interval to the next, and every interval over it cuts the cap under live.
    lives = [10, 10, 11, 10, 10, 11, 10, 10]
    p95 = [38.0, 45.0, 39.5, 47.0, 36.0, 44.0, 39.0, 41.0]
    caps = [11, 9, 12, 9, 11, 9, 11, 11]
    found = n_star_of([(float(i), n, c, p, TARGET_MS)
                       for i, (n, c, p) in enumerate(zip(lives, caps, p95))], ceiling=64)
    assert found is not None and found.n_star == 10 and found.intervals == 8


def test_a_stretch_mostly_over_the_target_does_not_count():
    # Five of eight intervals over the target (one censored): the median is over it.
    p95 = [45.0, 38.0, 47.0, math.inf, 39.0, 44.0, 39.0, 46.0]
    assert n_star_of([(float(i), 10, 9, p, TARGET_MS) for i, p in enumerate(p95)],
                     ceiling=64) is None
    # Four of eight over: the median is at the target.
    p95[0] = 39.0
    assert n_star_of([(float(i), 10, 9 if p > 42 else 11, p, TARGET_MS)
                      for i, p in enumerate(p95)], ceiling=64).n_star == 10
