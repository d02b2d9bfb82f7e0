"""Fault injection at retention: hostile run ids, an unwritable archive, a commit that fails,
a process killed half-way through archiving.

Each case says in its docstring what must survive."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import duckdb
import pytest

from runtime import RunConfig, Runner, execute
from store import archive, open_store
from store.archive_fs import UnsafePath, remove_tree
from store.schema import RUN_TABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOAD = dict(engine="twin", sessions=2, duration_s=1.0, pool_blocks=64)
HOSTILE_IDS = ["..", ".", "a/b", "../../etc", "x/../..", ".hidden", "run.partial", "", " "]


@pytest.fixture
def store(tmp_path):
    (tmp_path / "db").mkdir()  # its own folder: a deleted '..' would take it with the file
    s = open_store(str(tmp_path / "db" / "keep.duckdb"))
    yield s
    s.close()


def _age(store, run_id: str, days: float = 40) -> None:
    when = dt.datetime.now() - dt.timedelta(days=days)
    store.writer.call(lambda con: con.execute(
        "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = ?", [when, when, run_id]))


def _insert_run(store, run_id: str) -> None:
    store.writer.call(lambda con: con.execute(
        "INSERT INTO runs (run_id, started_at, ended_at, status) VALUES (?, ?, ?, 'finished')",
        [run_id, dt.datetime.now() - dt.timedelta(days=40),
         dt.datetime.now() - dt.timedelta(days=40)]))


def _counts(store, run_id: str) -> dict:
    cur = store.cursor()
    return {t: cur.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
            for t in RUN_TABLES}


def test_hostile_run_ids_never_become_paths(store):
    """Runs with ids '..', '.', 'a/b', ... in a hand-edited database. Must survive: the
    database file and its folder, every run archived before, and the hostile rows themselves
    (kept in the database, each with a failed archives row saying why)."""
    earlier = execute(RunConfig(**LOAD), store).run_id
    _age(store, earlier)
    assert archive.archive_older_than(store, 30 * 86400)[0].status == "archived"
    for run_id in HOSTILE_IDS:
        _insert_run(store, run_id)
    results = {r.run_id: r for r in archive.archive_older_than(store, 30 * 86400)}
    assert set(results) == set(HOSTILE_IDS)
    assert all(r.status == "failed" and "not a safe folder name" in r.reason
               for r in results.values())
    assert os.path.isfile(store.path)
    assert archive.archived_runs(store.path) == [earlier]
    assert archive.parquet_rows(archive.archive_dir(store.path) / earlier / "frames.parquet") > 0
    kept = {r[0] for r in store.cursor().execute("SELECT run_id FROM runs").fetchall()}
    assert kept == set(HOSTILE_IDS)
    with pytest.raises(UnsafePath):
        archive.open_archived(store.path, "..")
    with pytest.raises(ValueError, match="not a safe folder name"):
        Runner(RunConfig(**LOAD), None, store, run_id="../x")


def test_a_delete_outside_the_archive_root_is_refused(tmp_path):
    """The second line of defence: whatever the id check lets through, rmtree only inside."""
    root = tmp_path / "x.duckdb.archive"
    root.mkdir()
    (tmp_path / "precious").mkdir()
    for target in (root, root / "..", tmp_path / "precious", root / ".." / "precious"):
        with pytest.raises(UnsafePath):
            remove_tree(root, target)
    assert (tmp_path / "precious").is_dir() and root.is_dir()


def test_an_unwritable_archive_keeps_the_run_and_records_the_real_error(store):
    """The archive folder cannot be created (a file is in its place). Must survive: every row
    of the run in the database, the blocking file, and the OS's own error in `archives`."""
    run_id = execute(RunConfig(**LOAD), store).run_id
    _age(store, run_id)
    before = _counts(store, run_id)
    blocker = archive.archive_dir(store.path)
    blocker.write_text("not a folder")
    (result,) = archive.archive_older_than(store, 30 * 86400)
    assert result.status == "failed" and ("Errno" in result.reason or "exists" in result.reason)
    assert _counts(store, run_id) == before and blocker.read_text() == "not a folder"
    reason = store.cursor().execute("SELECT reason FROM archives WHERE run_id = ?",
                                    [run_id]).fetchone()[0]
    assert reason == result.reason


class _CommitFails:
    """The writer's connection, whose commit fails as a full disk's does: DuckDB has already
    ended the transaction, so a rollback afterwards says 'no transaction is active'."""

    def __init__(self, con):
        self._con = con

    def commit(self):
        self._con.rollback()
        raise duckdb.TransactionException(
            'Failed to commit: Could not write file "x.wal": File too large')

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_a_failed_commit_is_recorded_with_its_own_error(store):
    """The delete's commit fails. Must survive: the run's rows (rolled back, all there), the
    Parquet copy (a run may be in both places, never in neither), and the commit's real error
    in `archives`, not the rollback's 'no transaction is active'."""
    run_id = execute(RunConfig(**LOAD), store).run_id
    _age(store, run_id)
    before = _counts(store, run_id)
    real = store.writer._con
    store.writer._con = _CommitFails(real)
    try:
        (result,) = archive.archive_older_than(store, 30 * 86400)
    finally:
        store.writer._con = real
    assert result.status == "failed" and "File too large" in result.reason
    assert "no transaction" not in result.reason
    assert _counts(store, run_id) == before


_KILL_AT = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[3])
from store import archive, archive_fs, open_store
point = sys.argv[2]
if point == "before_rename":  # Parquet written, not yet renamed
    archive.durable_rename = lambda partial, final: os.kill(os.getpid(), signal.SIGKILL)
else:  # renamed, rows not yet deleted
    archive._delete_counted = lambda con, run_id, counts: os.kill(os.getpid(), signal.SIGKILL)
store = open_store(sys.argv[1])
archive.archive_older_than(store, 30 * 86400)
"""


@pytest.mark.parametrize("point", ["before_rename", "before_delete"])
def test_a_kill_during_archive_loses_nothing_and_the_next_archive_completes(store, point):
    """SIGKILL half-way through archiving (before the rename; after it, before the delete).
    Must survive: every row of the run in the database (at worst the run is in both places),
    no half archive listed as archived, and the next archive completes the move."""
    run_id = execute(RunConfig(**LOAD), store).run_id
    _age(store, run_id)
    before = _counts(store, run_id)
    path = store.path
    store.close()
    killed = subprocess.run([sys.executable, "-c", _KILL_AT, path, point, ROOT], timeout=60)
    assert killed.returncode == -9
    again = open_store(path)
    try:
        assert _counts(again, run_id) == before
        listed = archive.archived_runs(path)
        assert listed == ([] if point == "before_rename" else [run_id])
        (result,) = archive.archive_older_than(again, 30 * 86400)
        assert result.status == "archived" and result.rows == before
        assert set(_counts(again, run_id).values()) == {0}
        assert archive.archived_runs(path) == [run_id]
        assert not any(p.name.endswith(".partial") for p in archive.archive_dir(path).iterdir())
    finally:
        again.close()
