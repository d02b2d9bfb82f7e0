"""Real vLLM (tiny model, CPU): unbounded KV with a small pool walks into the silent cliff."""

import pytest

from runtime import RunConfig, Runner
from store.queries import frame_counts, occupancy

pytestmark = pytest.mark.vllm

LOAD = dict(engine="vllm", model="tiny", pool_blocks=64, sessions=8, frame_ms=160.0,
            duration_s=6.0)


@pytest.fixture(scope="module")
def engine(vllm_engines):
    return vllm_engines.get(RunConfig(policy="unbounded", **LOAD))


def test_sessions_outgrow_the_pool_and_go_silent(engine, store):
    s = Runner(RunConfig(policy="unbounded", **LOAD), engine, store).run()
    assert s.status == "finished", s.reason
    assert s.max_occupancy >= 0.95
    assert s.stalled is True and 0.5 < s.stall_at_s < 5
    assert s.silent_rate > 0.3
    occ = occupancy(store.cursor(), s.run_id)
    stalled = occ[occ.t > s.stall_at_s + 0.5]
    assert (stalled.running == 0).all()  # no running request, no error, no preemption
    assert s.tsat_pred_s is not None
    assert frame_counts(store.cursor(), s.run_id)["frames"] == s.frames
    # After the stall no frame is answered: its latency is unknown, and so is the p95 (its rank
    # is among those frames): reported as censored, never as the budget.
    assert s.censored_frames > 0 and s.p95_censored and s.p95_ms is None
    assert s.rows_lost == 0


def test_wait_budget_keeps_naive_metrics_green_while_frames_are_silent(engine, store):
    s = Runner(RunConfig(policy="unbounded", wait_budget=0.5, **LOAD), engine, store).run()
    assert s.stalled is True
    assert s.naive_on_time_rate >= 0.95
    assert s.silent_rate > 0.3
    assert s.naive_p95_ms <= 0.5 * 160.0 + 1e-6
