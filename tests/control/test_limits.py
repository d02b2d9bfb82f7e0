import pytest

from control.limits import AIMDConfig, AIMDLimit, FixedLimit, Gate


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


def test_gate_rejects_over_limit_with_a_reason_and_releases():
    gate = Gate(FixedLimit(2))
    assert gate.acquire() is None and gate.acquire() is None
    assert gate.acquire() == "over_limit"
    gate.release()
    assert gate.acquire() is None
    assert (gate.admitted, gate.rejected) == (3, 1)
