"""Console fixtures: a database per test, AppTest of the whole app, run-host helpers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from console.shell import run_host
from services.run_host import ACTIVE
from runtime import RunConfig
from store import open_store

APP = str(Path(__file__).resolve().parents[2] / "console_app.py")
PAGES = "console/pages"  # relative to the console script (console_app.py)
RUN_TIMEOUT_S = 30.0


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "console.duckdb")
    monkeypatch.setenv("METRONOME_DB", path)
    yield path
    # The page's RunHost is process-wide (st.cache_resource); releasing it stops its run and
    # keeps one test's run out of the next test's page.
    st.cache_resource.clear()


def page(name: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=20).run()
    if name is not None:
        at.switch_page(f"{PAGES}/{name}.py").run()
    return at


def charts_by_title(at: AppTest) -> dict[str, list[int]]:
    """The page's vega-lite charts by title, with the row count of each dataset (Altair ships
    the data as Arrow IPC streams beside the spec)."""
    found = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        title = spec.get("title")
        title = title.get("text") if isinstance(title, dict) else title
        found[title] = [pa.ipc.open_stream(d.data.data).read_all().num_rows
                        for d in element.proto.datasets]
    return found


def wait_settled(timeout: float = RUN_TIMEOUT_S):
    host = run_host()
    deadline = time.monotonic() + timeout
    while host.state().status in ACTIVE:
        assert time.monotonic() < deadline, host.state()
        time.sleep(0.02)
    return host.state()


def finished_twin_run(db: str, **settings) -> str:
    """A twin run, finished and flushed, started through the console's own host."""
    config = RunConfig(**{"engine": "twin", "sessions": 6, "pool_blocks": 64,
                          "duration_s": 4.0, **settings})
    run_id = run_host().start(config, db)
    assert wait_settled().status == "finished"
    open_store(db).writer.flush()
    return run_id


def running_paced_twin(db: str, **settings) -> str:
    """A paced twin run (wall-clock time) that stays running while a test changes it."""
    config = RunConfig(**{"engine": "twin", "paced": True, "sessions": 4, "pool_blocks": 256,
                          "duration_s": 120.0, **settings})
    host = run_host()
    run_id = host.start(config, db)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while host.state().status != "running":
        assert time.monotonic() < deadline, host.state()
        time.sleep(0.02)
    return run_id
