"""The console page (through Streamlit's AppTest), its run host and its chart builders.

Only the twin engine runs here: it simulates a run in milliseconds and never starts vLLM.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app import charts
from app.engine_host import RunHost
from runtime import RunConfig, make_engine
from store import open_store, queries

APP = str(Path(__file__).resolve().parents[2] / "streamlit_app.py")
RUN_TIMEOUT_S = 20.0


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "console.duckdb")
    monkeypatch.setenv("METRONOME_DB", path)
    yield path
    # The page's RunHost is process-wide (st.cache_resource); releasing it stops its run and
    # keeps one test's run out of the next test's page.
    st.cache_resource.clear()


def _page() -> AppTest:
    return AppTest.from_file(APP, default_timeout=10).run()


def _charts(at: AppTest) -> dict[str, dict]:
    """The page's vega-lite charts by title: their spec and the row count of each dataset
    (st.altair_chart ships the data as Arrow IPC streams beside the spec)."""
    found = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        rows = [pa.ipc.open_stream(d.data.data).read_all().num_rows
                for d in element.proto.datasets]
        found[spec["title"]] = {"spec": spec, "rows": rows}
    return found


def _status_line(at: AppTest) -> str:
    bars = at.get("progress")
    return bars[0].text if bars else ""


def test_page_renders_with_an_empty_database(db):
    at = _page()

    assert not at.exception
    assert not at.error
    assert "No runs yet" in at.info[0].value
    assert at.selectbox(key="engine").value == "vllm"
    assert "twin (simulated)" in at.selectbox(key="engine").format_func("twin")
    assert at.selectbox(key="view_run").options == ["current run (live)"]


def test_twin_run_from_the_form_shows_its_charts_and_is_recorded(db):
    at = _page()
    at.selectbox(key="engine").select("twin")
    at.selectbox(key="policy").select("unbounded")
    at.number_input(key="sessions").set_value(6)
    at.number_input(key="pool_blocks").set_value(64)
    at.number_input(key="duration_s").set_value(3.0)
    at.button(key="start").click().run()

    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not _status_line(at).startswith("finished"):
        assert not at.exception and not at.error, (at.exception, at.error)
        assert time.monotonic() < deadline, f"run did not finish: {_status_line(at)!r}"
        time.sleep(0.1)
        at.run()

    assert "simulated" in _status_line(at)
    shown = _charts(at)
    assert set(shown) == {"Frame latency vs budget", "KV pool occupancy",
                          "Silent frames per second"}
    assert all(rows > 0 for chart in shown.values() for rows in chart["rows"]), shown
    run_id = _status_line(at).split(" · ")[1].removeprefix("run ")
    assert any(label.startswith(run_id) for label in at.selectbox(key="view_run").options)
    row = queries.run_row(open_store(db).cursor(), run_id)
    assert row["status"] == "finished"
    assert row["simulated"]
    assert (row["sessions"], row["pool_blocks"], row["duration_s"]) == (6, 64, 3.0)


def test_invalid_window_is_reported_inline_and_starts_nothing(db):
    at = _page()
    at.selectbox(key="engine").select("twin")
    at.selectbox(key="policy").select("window")
    at.number_input(key="window").set_value(16)  # below one 32-token block
    at.button(key="start").click().run()

    assert not at.exception
    assert len(at.error) == 1
    message = at.error[0].value
    assert "window" in message and "\n" not in message
    assert not at.get("progress")
    assert queries.runs(open_store(db).cursor()).empty


# --- the run host -----------------------------------------------------------------------------
def _wait_until_settled(host: RunHost) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while host.state()["status"] in ("starting", "running", "stopping"):
        assert time.monotonic() < deadline, host.state()
        time.sleep(0.01)
    return host.state()


def test_host_records_an_engine_start_failure_as_one_line(tmp_path):
    def broken_engine(config, store):
        raise RuntimeError("no accelerator found\nlong traceback-ish detail")

    host = RunHost(engine_factory=broken_engine)
    host.start(RunConfig(engine="twin"), str(tmp_path / "h.duckdb"))

    state = _wait_until_settled(host)
    assert state["status"] == "failed"
    assert state["error"] == "engine did not start: no accelerator found"


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
    assert host.state()["status"] == "starting"
    assert host.state()["run_id"] == run_id
    with pytest.raises(ValueError, match="still starting"):
        host.start(config, str(tmp_path / "h.duckdb"))

    host.stop()
    release.set()
    state = _wait_until_settled(host)
    assert state["status"] == "aborted"
    assert shut_down.is_set()


def test_host_reports_a_finished_run_with_its_summary(tmp_path):
    host = RunHost()
    run_id = host.start(RunConfig(engine="twin", sessions=2, duration_s=1.0),
                        str(tmp_path / "h.duckdb"))

    state = _wait_until_settled(host)
    assert state["status"] == "finished"
    assert state["progress"] == 1.0
    assert state["error"] is None
    assert state["summary"]["run_id"] == run_id
    assert state["simulated"]


# --- chart builders ---------------------------------------------------------------------------
@pytest.mark.parametrize("build", [
    lambda df: charts.latency_chart(df, 80.0, 64.0),
    charts.occupancy_chart,
    charts.silent_chart,
])
def test_charts_accept_an_empty_frame(build):
    spec = build(pd.DataFrame()).to_dict()
    assert spec["title"]


def test_latency_chart_draws_the_budget_and_dashes_the_naive_p95():
    df = pd.DataFrame({"t": [0.0, 1.0], "p50_ms": [10.0, 12.0], "p95_ms": [20.0, 25.0],
                       "p99_ms": [30.0, 90.0], "naive_p95_ms": [20.0, 24.0], "frames": [8, 8]})
    spec = charts.latency_chart(df, 80.0).to_dict()

    datasets = list(spec["datasets"].values())
    assert {"label": "budget 80 ms", "ms": 80.0} in datasets[1]
    dash = spec["layer"][0]["encoding"]["strokeDash"]["scale"]
    naive = dash["domain"].index(charts.NAIVE_LABEL)
    assert dash["range"][naive] != dash["range"][0]
    assert {"t": 1.0, "series": "p99", "ms": 90.0} in datasets[0]


def test_occupancy_chart_is_pinned_to_zero_one():
    spec = charts.occupancy_chart(pd.DataFrame({"t": [0.0], "occupancy": [0.2],
                                                "used_blocks": [1], "total_blocks": [5],
                                                "live": [1]})).to_dict()
    assert spec["encoding"]["y"]["scale"]["domain"] == [0, 1]
