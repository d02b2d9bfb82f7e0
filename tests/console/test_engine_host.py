"""The run host on its own: start failures, one run at a time, series, live changes."""

from __future__ import annotations

import threading
import time

import pytest

from services.run_host import RunHost
from runtime import RunConfig, make_engine

RUN_TIMEOUT_S = 20.0


def _wait_until_settled(host: RunHost) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while host.state().status in ("starting", "running", "stopping"):
        assert time.monotonic() < deadline, host.state()
        time.sleep(0.01)
    return host.state()


def test_host_records_an_engine_start_failure_as_one_line(tmp_path):
    def broken_engine(config, store):
        raise RuntimeError("no accelerator found\nlong traceback-ish detail")

    host = RunHost(engine_factory=broken_engine)
    host.start(RunConfig(engine="twin"), str(tmp_path / "h.duckdb"))

    state = _wait_until_settled(host)
    assert state.status == "failed"
    assert state.error == "engine did not start: no accelerator found"


def test_host_runs_one_at_a_time_and_shuts_a_stopped_engine_down(tmp_path):
    release = threading.Event()
    shut_down = threading.Event()

    def slow_engine(config, store):  # stands in for vLLM's ~20 s start
        release.wait(RUN_TIMEOUT_S)
        engine = make_engine(config, store)
        engine.shutdown = shut_down.set
        return engine

    host = RunHost(engine_factory=slow_engine)
    config = RunConfig(engine="twin", sessions=2, duration_s=1.0)
    run_id = host.start(config, str(tmp_path / "h.duckdb"))
    assert host.state().status == "starting"
    assert host.state().run_id == run_id
    with pytest.raises(ValueError, match="still starting"):
        host.start(config, str(tmp_path / "h.duckdb"))

    host.stop()
    release.set()
    state = _wait_until_settled(host)
    assert state.status == "aborted"
    assert shut_down.is_set()


def test_host_reports_a_finished_run_with_its_summary(tmp_path):
    host = RunHost()
    run_id = host.start(RunConfig(engine="twin", sessions=2, duration_s=1.0),
                        str(tmp_path / "h.duckdb"))

    state = _wait_until_settled(host)
    assert state.status == "finished"
    assert state.progress == 1.0
    assert state.error is None
    assert state.summary["run_id"] == run_id
    assert state.simulated




def test_host_runs_a_series_one_engine_at_a_time_and_reports_its_progress(tmp_path):
    engines = []

    def counting_engine(config, store):
        assert all(e.closed for e in engines), "a series must shut one engine before the next"
        engine = make_engine(config, store)
        engine.closed = False
        shutdown = engine.shutdown
        engine.shutdown = lambda: (shutdown(), setattr(engine, "closed", True))
        engines.append(engine)
        return engine

    host = RunHost(engine_factory=counting_engine)
    configs = [RunConfig(engine="twin", sessions=2, duration_s=1.0, seed=s) for s in range(3)]
    run_ids = host.start_series(configs, str(tmp_path / "h.duckdb"), kind="collapse")

    state = _wait_until_settled(host)
    assert state.status == "finished"
    assert state.run_id == run_ids[-1] and len(set(run_ids)) == 3
    assert state.series.kind == "collapse"
    assert state.series.progress == 1.0 and state.series.index == 2
    assert len(engines) == 3 and all(e.closed for e in engines)


def test_host_applies_live_changes_only_while_a_run_runs(tmp_path):
    host = RunHost()
    with pytest.raises(ValueError, match="no run is running"):
        host.apply(target=0.5)
    host.start(RunConfig(engine="twin", paced=True, sessions=2, duration_s=60.0,
                         admission="aimd"), str(tmp_path / "h.duckdb"))
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while host.state().status != "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "latency target 0.50" in host.apply(target=0.5)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while host.live_settings().target != 0.5:  # applied at the next tick
        assert time.monotonic() < deadline, host.live_settings()
        time.sleep(0.01)
    host.close()
    assert host.state().status == "aborted"


# --- prepared series (the one-click demo: calibrate first, then the runs) ---------------------
def _settled(host: RunHost):
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while host.state().status in ("preparing", "starting", "running", "stopping"):
        assert time.monotonic() < deadline, host.state()
        time.sleep(0.01)
    return host.state()


def test_a_prepared_series_reports_its_preparation_then_runs_what_it_returned(tmp_path):
    go = threading.Event()

    def prepare(store, progress):
        progress(0.5, "calibrating: half way")
        go.wait(RUN_TIMEOUT_S)
        return [RunConfig(engine="twin", sessions=2, duration_s=1.0),
                RunConfig(engine="twin", sessions=3, duration_s=1.0)]

    host = RunHost()
    run_ids = host.start_prepared(prepare, 2, str(tmp_path / "h.duckdb"), kind="cliff vs slope")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while host.state().note is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    state = host.state()
    assert state.status == "preparing" and state.note == (0.5, "calibrating: half way")
    assert state.series.run_ids == tuple(run_ids) and len(run_ids) == 2
    go.set()
    state = _settled(host)
    assert state.status == "finished" and state.run_id == run_ids[1]


def test_a_prepared_series_stopped_while_preparing_runs_nothing(tmp_path):
    started = threading.Event()

    def prepare(store, progress):
        started.set()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            progress(0.1, "calibrating")  # raises once the host is stopped
            time.sleep(0.01)
        raise AssertionError("progress never raised")

    host = RunHost()
    host.start_prepared(prepare, 2, str(tmp_path / "h.duckdb"), kind="cliff vs slope")
    assert started.wait(RUN_TIMEOUT_S)
    host.stop()
    assert _settled(host).status == "aborted"


def test_a_failed_preparation_is_one_line_and_a_count_mismatch_is_refused(tmp_path):
    host = RunHost()
    host.start_prepared(lambda store, progress: 1 / 0, 2, str(tmp_path / "h.duckdb"))
    state = _settled(host)
    assert state.status == "failed" and state.error == "division by zero"
    host.start_prepared(lambda store, progress: [], 2, str(tmp_path / "h.duckdb"))
    assert _settled(host).error == "preparation gave 0 runs, not 2"
    host.start_prepared(lambda store, progress: [], 0, str(tmp_path / "h.duckdb"),
                        kind="calibration")
    assert _settled(host).status == "finished"
