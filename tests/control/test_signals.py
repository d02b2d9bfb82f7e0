import math

import pytest

from control.signals import StallDetector, fit_occupancy, percentile, predict_t_sat


def test_percentile_interpolates_like_quantile_cont():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([10], 0.95) == 10
    assert percentile([], 0.5) is None
    assert math.isclose(percentile(list(range(101)), 0.95), 95.0)
    with pytest.raises(ValueError, match="quantile 1.5"):
        percentile([1], 1.5)


def test_fit_recovers_a_linear_fill_and_its_saturation_time():
    ts = [i * 0.1 for i in range(30)]
    rhos = [0.1 + 0.3 * t for t in ts]
    fit = fit_occupancy(ts, rhos)
    assert math.isclose(fit.rho0, 0.1, abs_tol=1e-9)
    assert math.isclose(fit.slope_per_s, 0.3, rel_tol=1e-9)
    assert math.isclose(fit.t_sat(), 3.0, rel_tol=1e-9)


def test_flat_occupancy_never_saturates():
    fit = fit_occupancy([0, 1, 2, 3], [0.5, 0.5, 0.5, 0.5])
    assert fit.t_sat() is None
    assert fit_occupancy([0, 0, 1], [0.1, 0.2, 0.3]) is None  # two distinct times only


def test_predict_uses_only_the_first_third_of_the_fill():
    # Linear fill to 1.0 at t = 2 s, then pinned at 1: the early fit must say 2 s.
    ts = [i * 0.05 for i in range(80)]
    rhos = [min(1.0, 0.02 + 0.49 * t) for t in ts]
    assert math.isclose(predict_t_sat(ts, rhos), (1 - 0.02) / 0.49, rel_tol=1e-6)
    assert predict_t_sat(ts, [0.0] * len(ts)) is None


def test_stall_needs_a_full_pool_owed_frames_and_consecutive_quiet_ticks():
    det = StallDetector(min_ticks=3)
    assert not det.update(0.0, tokens_out=5, frames_waiting=4, occupancy=1.0)
    assert not det.update(0.1, 0, 4, 1.0)
    assert not det.update(0.2, 0, 4, 1.0)
    assert det.update(0.3, 0, 4, 1.0)
    assert det.stall_at == 0.1
    assert not det.update(0.4, 2, 4, 1.0)  # progress clears the stall, keeps the first time
    assert det.stall_at == 0.1
    idle = StallDetector(min_ticks=1)
    assert not idle.update(0.0, 0, frames_waiting=0, occupancy=1.0)  # nothing owed
    hiccup = StallDetector(min_ticks=1)
    assert not hiccup.update(0.0, 0, frames_waiting=8, occupancy=0.6)  # room left: not a stall
