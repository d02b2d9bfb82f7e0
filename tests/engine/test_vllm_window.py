"""Real vLLM (tiny model, CPU): the same load with a window plateaus below 1, nothing silent;
the run's engine steps fit the twin's cost model."""

import pytest

from engine.twin import TwinEngine, fit_cost_model
from runtime import RunConfig, Runner, make_engine
from store.queries import occupancy, steps

pytestmark = pytest.mark.vllm

LOAD = dict(engine="vllm", model="tiny", pool_blocks=64, sessions=8, frame_ms=160.0,
            duration_s=6.0, policy="window", window=128)


@pytest.fixture(scope="module")
def engine():
    eng = make_engine(RunConfig(**LOAD))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def window_run(engine, tmp_path_factory):
    from store import Store

    st = Store(str(tmp_path_factory.mktemp("db") / "w.duckdb"))
    summary = Runner(RunConfig(**LOAD), engine, st).run()
    yield summary, st
    st.close()


def test_window_plateaus_below_one_and_never_goes_silent(window_run):
    s, st = window_run
    assert s["status"] == "finished", s["reason"]
    assert s["stalled"] is False and s["stall_at_s"] is None
    assert s["silent_frames"] == 0
    assert s["max_occupancy"] < 1.0
    assert s["max_resident_blocks"] <= 128 // 32 + 1
    occ = occupancy(st.cursor(), s["run_id"])
    late = occ[occ.t > 3].occupancy
    assert late.median() < 0.9
    assert late.tail(5).median() - late.head(5).median() <= 0.05  # a plateau, not a ramp


def test_twin_fitted_from_the_run_predicts_its_latency(window_run):
    s, st = window_run
    model, facts = fit_cost_model(steps(st.cursor(), s["run_id"]), source=s["run_id"])
    assert facts["n_steps"] >= 20 and model.a_ms > 0
    cfg = RunConfig(**{**LOAD, "engine": "twin"})
    twin = Runner(cfg, TwinEngine(cfg.engine_config(), model), st).run()
    assert twin["silent_frames"] == 0
    # Same load, fitted costs: the simulated median frame latency lands near the real one.
    assert 0.5 < twin["p50_ms"] / s["p50_ms"] < 2.0, (twin["p50_ms"], s["p50_ms"], model)
