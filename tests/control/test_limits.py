import math

import pytest

from control.admission import Gate, MemoryGuard, MemoryGuardConfig, MemorySignals
from control.limits import (AIMDConfig, AIMDLimit, FixedLimit, GradientConfig, GradientLimit,
                            Limit, make_limit)
from control.signals import OccupancyTracker
from control.window import WindowedLimit


def test_aimd_backs_off_on_drop_and_grows_near_the_cap():
    limit = AIMDLimit(AIMDConfig(initial=10, min_limit=2, max_limit=12, increase=1, backoff=0.5,
                                 target_fraction=0.8), budget_ms=100)
    seen = []
    limit.on_change(seen.append)
    assert limit.on_sample(0, latency_ms=50, inflight=10, dropped=False) == 11
    assert limit.on_sample(1, latency_ms=50, inflight=3, dropped=False) == 11  # far below cap
    assert limit.on_sample(2, latency_ms=81, inflight=11, dropped=False) == 5  # over 0.8·budget
    assert limit.on_sample(3, latency_ms=10, inflight=5, dropped=True) == 2  # silent frame
    assert limit.on_sample(4, latency_ms=10, inflight=2, dropped=True) == 2  # clamped at min
    for _ in range(20):
        limit.on_sample(5, 10, limit.limit, False)
    assert limit.limit == 12  # clamped at max
    assert seen[:3] == [11, 5, 2]


@pytest.mark.parametrize("kwargs, match", [
    ({"backoff": 1.0}, "backoff 1.0"), ({"backoff": 0.4}, "backoff 0.4"),
    ({"initial": 0}, "initial limit 0"), ({"min_limit": 5, "max_limit": 4}, "min 5"),
    ({"target_fraction": 0}, "target 0"), ({"increase": 0}, "increase 0"),
])
def test_aimd_config_names_the_bad_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AIMDConfig(**kwargs)


def test_gradient_shrinks_with_latency_and_probes_up_with_headroom():
    limit = GradientLimit(GradientConfig(initial=16, max_limit=64, smoothing=1.0), budget_ms=100)
    # (inflight low: the live anchor ⌊0.9 · live⌋ is below the gradient's cut)
    assert limit.on_sample(0, latency_ms=160, inflight=4, dropped=False) == 8  # 80/160 = 0.5
    assert limit.on_sample(1, latency_ms=40, inflight=8, dropped=False) == 10  # 8 + √8
    assert limit.on_sample(2, latency_ms=40, inflight=2, dropped=False) == 10  # cap unused
    assert limit.on_sample(3, latency_ms=1, inflight=2, dropped=True) == 5  # a drop halves
    smooth = GradientLimit(GradientConfig(initial=16, smoothing=0.25), budget_ms=100)
    assert smooth.on_sample(0, 160, 16, False) == 14  # 16 − 0.25·8
    with pytest.raises(ValueError, match="smoothing 0"):
        GradientConfig(smoothing=0)


def test_memory_guard_projects_the_fill_over_the_lifetime():
    guard = MemoryGuard(MemoryGuardConfig(max_plateau=0.9))
    # unbounded: 2 live + 1 at 0.05 ρ/s each from ρ 0.4 → full in 4 s
    assert guard.admits(0.4, 2, 0.05, None, lifetime_s=3.0)
    assert not guard.admits(0.4, 2, 0.05, None, lifetime_s=5.0)
    # bounded: 0.1 of the pool each → 9 sessions is 0.9: refused; 8 is fine
    assert guard.admits(0.7, 7, 0.0, 0.1, lifetime_s=1e9)
    assert not guard.admits(0.8, 8, 0.0, 0.1, lifetime_s=1e9)


def test_gate_grants_tickets_rejects_with_reasons_and_releases():
    cap = FixedLimit(2)
    gate = Gate(lambda: cap, MemoryGuard(MemoryGuardConfig(max_plateau=0.5)))
    mem = MemorySignals(rho_now=0.0, growth_per_session_per_s=0.0, plateau_per_session=0.3,
                        lifetime_s=10.0)
    first = gate.acquire(mem)
    assert first is not None and gate.last_rejection is None
    assert gate.acquire(mem) is None and gate.last_rejection == "memory_guard"  # 2 × 0.3 ≥ 0.5
    second = gate.acquire(None)  # no memory signals: only the limit applies
    assert second is not None and second != first
    assert gate.acquire(None) is None and gate.last_rejection == "over_limit"
    gate.release(first)
    assert gate.live == 1
    assert gate.rejected == {"over_limit": 1, "memory_guard": 1} and gate.admitted == 2
    with pytest.raises(AssertionError):
        gate.release(first)  # a ticket is handed back once
    # The pool a session would join counts its own sessions (a data-parallel rank's), not the
    # gate's: with the gate's one live session 2 × 0.3 ≥ 0.5, on an empty rank 0.3 is room.
    assert gate.acquire(mem) is None
    assert gate.acquire(MemorySignals(0.0, 0.0, 0.3, 10.0, live=0)) is not None


def test_limits_share_one_protocol_and_swap_live():
    aimd = make_limit("aimd", 80.0, cap=8, target_fraction=0.5)
    fixed = make_limit("fixed", 80.0, cap=8, target_fraction=0.5, overrides={"limit": 3})
    assert isinstance(aimd, Limit) and isinstance(fixed, Limit)
    aimd.retarget(0.25)
    assert aimd.target_ms == 20.0
    fixed.retarget(0.25)  # no target: ignored, the cap stays
    assert fixed.limit == 3
    owner = [aimd]  # the run's live settings, in miniature: the one holder of the limit
    gate, windowed = Gate(lambda: owner[0]), WindowedLimit(lambda: owner[0], 1.0, min_samples=1)
    assert gate.limit is aimd and windowed.limit == aimd.limit
    owner[0] = fixed  # a swap by the owner reaches both readers
    assert gate.limit is fixed and windowed.limit == 3
    with pytest.raises(ValueError, match="limit 'pid' is not one of fixed, aimd, gradient"):
        make_limit("pid", 80.0, cap=8, target_fraction=0.5)


def test_occupancy_tracker_fits_recent_samples_only():
    tr = OccupancyTracker(window_s=1.0, min_samples=3)
    for i in range(40):  # flat for 2 s, then rising at 0.2/s
        t = i * 0.1
        tr.add(t, 0.3 if t < 2 else 0.3 + 0.2 * (t - 2))
    assert math.isclose(tr.fit().slope_per_s, 0.2, rel_tol=1e-6)
    assert math.isclose(tr.t_sat_from_now(), (1 - tr.rho_now) / 0.2, rel_tol=1e-6)
