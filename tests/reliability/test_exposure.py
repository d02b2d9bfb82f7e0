"""Exposure: loopback by default, SQL built from user input is parameterised."""

import tomllib
from pathlib import Path

from runtime import RunConfig, execute
from store.queries import events, frame_counts, latency_percentiles, run_row, runs

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["'; DROP TABLE runs; --", "x' OR '1'='1", 'a"b', "run\x00id", "%_%"]


def test_console_binds_loopback_unless_told_otherwise():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"


def test_hostile_run_ids_are_data_not_sql(store):
    s = execute(RunConfig(engine="twin", sessions=2, duration_s=1.0), store)
    cur = store.cursor()
    for text in HOSTILE:
        assert run_row(cur, text) is None
        assert frame_counts(cur, text) == {"frames": 0, "silent_frames": 0}
        assert latency_percentiles(cur, text).empty and events(cur, text).empty
    assert run_row(cur, s["run_id"])["status"] == "finished"  # the table is still there
    assert len(runs(cur)) == 1
