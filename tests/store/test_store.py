import subprocess
import sys
import time

import pytest

from store import Store, StoreError, db_path
from store.queries import frame_counts, latency_percentiles


def _frame(run_id, i, latency, silent=False):
    return {"run_id": run_id, "session_id": i % 4, "frame_idx": i, "t_submit": i * 0.08,
            "latency_ms": latency, "naive_latency_ms": min(latency, 40.0), "tokens_out": 0 if silent else 4,
            "tokens_expected": 4, "on_time": latency <= 80, "naive_on_time": True,
            "silent": silent, "skipped": False, "complete": not silent}


def test_writer_batches_rows_and_flushes_them(store):
    store.writer.add_many("frames", [_frame("r1", i, float(i % 100)) for i in range(5000)])
    store.writer.flush()
    assert frame_counts(store.cursor(), "r1") == {"frames": 5000, "silent_frames": 0}
    df = latency_percentiles(store.cursor(), "r1", bucket_s=100.0)
    assert len(df) == 4 and {"p50_ms", "p95_ms", "p99_ms", "naive_p95_ms"} <= set(df.columns)
    assert (df["p95_ms"] >= df["p50_ms"]).all()


def test_rows_reach_disk_without_an_explicit_flush(store):
    store.writer.add("frames", _frame("r2", 0, 10.0))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and frame_counts(store.cursor(), "r2")["frames"] == 0:
        time.sleep(0.05)
    assert frame_counts(store.cursor(), "r2")["frames"] == 1


def test_unknown_table_is_refused(store):
    with pytest.raises(ValueError, match="table 'nope'"):
        store.writer.add("nope", {})


def test_runs_left_running_are_marked_aborted_on_reopen(tmp_path):
    path = str(tmp_path / "a.duckdb")
    s = Store(path)
    s.writer.execute("INSERT INTO runs (run_id, status) VALUES (?, ?)", ["dead", "running"])
    s.writer.flush()
    s.close()
    s = Store(path)
    status, reason, ended = s.cursor().execute(
        "SELECT status, reason, ended_at FROM runs WHERE run_id = 'dead'").fetchone()
    s.close()
    assert status == "aborted" and "process ended" in reason and ended is not None


def test_second_process_gets_a_one_line_message_naming_the_holder(tmp_path):
    path = str(tmp_path / "locked.duckdb")
    s = Store(path)
    try:
        code = (f"from store import Store, StoreError\n"
                f"try:\n    Store({path!r})\nexcept StoreError as e:\n    print(e)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    finally:
        s.close()
    assert out.startswith(f"database {path} is in use by process ")
    assert len(out.splitlines()) == 1


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Store(str(tmp_path / "no" / "such" / "x.duckdb"))


def test_db_path_precedence(monkeypatch):
    monkeypatch.setenv("METRONOME_DB", "/tmp/env.duckdb")
    assert db_path("/tmp/flag.duckdb") == "/tmp/flag.duckdb"
    assert db_path(None) == "/tmp/env.duckdb"
    monkeypatch.delenv("METRONOME_DB")
    assert db_path(None) == "metronome.duckdb"


def test_buckets_without_latency_are_gaps_not_errors(store):
    from store.queries import frame_buckets

    rows = [_frame("r3", i, float(i)) for i in range(10)]
    for row in rows[5:]:
        row["latency_ms"] = None  # as older files recorded never-submitted frames
        row["t_submit"] = 10.0 + row["frame_idx"]
    store.writer.add_many("frames", rows)
    store.writer.flush()
    df = frame_buckets(store.cursor(), "r3", bucket_s=5.0)
    assert df.p50_ms.notna().sum() == 1 and df.p95_ms.isna().sum() == len(df) - 1


def test_duckdb_leaves_the_engines_two_cores_alone(tmp_path, monkeypatch):
    """DuckDB would take every core; a run's database takes all but the two an engine's
    processes keep busy (at least one), or what METRONOME_DB_THREADS says."""
    import os

    from store import DB_THREADS_ENV, db_threads

    monkeypatch.delenv(DB_THREADS_ENV, raising=False)
    expected = max(1, len(os.sched_getaffinity(0)) - 2)
    store = Store(str(tmp_path / "a.duckdb"))
    try:
        assert db_threads() == expected
        assert store.cursor().execute("SELECT current_setting('threads')").fetchone()[0] \
            == expected
    finally:
        store.close()
    monkeypatch.setenv(DB_THREADS_ENV, "3")
    store = Store(str(tmp_path / "b.duckdb"))
    try:
        assert store.cursor().execute("SELECT current_setting('threads')").fetchone()[0] == 3
    finally:
        store.close()
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(DB_THREADS_ENV, bad)
        with pytest.raises(ValueError, match=f"METRONOME_DB_THREADS='{bad}'"):
            Store(str(tmp_path / "c.duckdb"))
