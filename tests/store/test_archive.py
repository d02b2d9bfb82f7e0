"""Retention: old runs move to Parquet, verified row for row, and read back from there."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from runtime import RunConfig, execute
from store import archive, open_store, queries
from store.schema import RUN_TABLES

LOAD = dict(engine="twin", policy="unbounded", pool_blocks=64, sessions=6, duration_s=4.0)


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "keep.duckdb"))
    yield s
    s.close()


def _age(store, run_id: str, days: float) -> None:
    when = dt.datetime.now() - dt.timedelta(days=days)
    store.writer.call(lambda con: con.execute(
        "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = ?", [when, when, run_id]))


def _counts(store, run_id: str) -> dict:
    cur = store.cursor()
    return {t: cur.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
            for t in RUN_TABLES}


def test_old_runs_move_to_parquet_with_every_row(store):
    old = execute(RunConfig(**LOAD), store).run_id
    new = execute(RunConfig(**LOAD, seed=1), store).run_id
    _age(store, old, 40)
    before = _counts(store, old)
    assert before["frames"] > 100 and before["ticks"] > 10 and before["steps"] > 10

    results = archive.archive_older_than(store, 30 * 86400)

    assert [(r.run_id, r.status) for r in results] == [(old, "archived")]
    assert results[0].rows == before
    folder = archive.archive_dir(store.path) / old
    assert results[0].path == str(folder)
    for table, n in before.items():
        assert archive.parquet_rows(folder / f"{table}.parquet") == n, table
    assert set(_counts(store, old).values()) == {0}  # gone from the database
    assert _counts(store, new)["frames"] > 0  # the young run stays
    assert archive.archived_runs(store.path) == [old]
    logged = store.cursor().execute(
        "SELECT status, row_counts FROM archives WHERE run_id = ?", [old]).fetchone()
    assert logged[0] == "archived" and json.loads(logged[1]) == before

    con = archive.open_archived(store.path, old)  # the same queries, over Parquet
    try:
        assert queries.frame_counts(con, old)["frames"] == before["frames"]
        assert queries.run_row(con, old)["status"] == "finished"
    finally:
        con.close()


def test_a_count_mismatch_keeps_the_run_and_says_why(store, monkeypatch):
    run_id = execute(RunConfig(**LOAD), store).run_id
    _age(store, run_id, 40)
    before = _counts(store, run_id)
    real = archive.parquet_rows
    monkeypatch.setattr(archive, "parquet_rows",  # a file that lost a row on the way
                        lambda path: real(path) - (path.name == "frames.parquet"))

    (result,) = archive.archive_older_than(store, 30 * 86400)

    assert result.status == "failed" and "differ from the database" in result.reason
    assert _counts(store, run_id) == before  # nothing deleted
    assert archive.archived_runs(store.path) == []  # no half archive left behind
    status, reason = store.cursor().execute(
        "SELECT status, reason FROM archives WHERE run_id = ?", [run_id]).fetchone()
    assert status == "failed" and "ArchiveMismatch" in reason


def test_running_and_young_runs_are_never_archived(store):
    store.writer.call(lambda con: con.execute(
        "INSERT INTO runs (run_id, started_at, status) VALUES ('live', ?, 'running')",
        [dt.datetime.now() - dt.timedelta(days=90)]))
    execute(RunConfig(**LOAD), store)
    assert archive.old_runs(store.cursor(), 30 * 86400) == []
    with pytest.raises(ValueError, match=r"retention age 0 s must be in \(0, "):
        archive.old_runs(store.cursor(), 0)
