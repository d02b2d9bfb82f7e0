"""Fault injection at the store: a full disk, a database locked by another process.

Each case says in its docstring what must survive."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import duckdb
import pytest

from store import Store, StoreError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILE_LIMIT = 1 << 20  # bytes a file may grow to: `ulimit -f 1024`


def _cli(*args, limit_files: bool = False, timeout: float = 120):
    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))

    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          preexec_fn=small_files if limit_files else None)


def test_a_full_disk_fails_the_run_loudly_and_keeps_what_reached_the_disk(tmp_path):
    """Disk full mid-run (every file capped at 1 MB, as `ulimit -f 1024`). Must survive: the
    process (no SIGABRT: exit 1, not 134), the JSON on stdout, one `metronome: error:` line
    naming the cause, the run's row marked failed with that cause, and every frame that reached
    the disk (stored + counted lost = frames the run made)."""
    db = str(tmp_path / "full.duckdb")
    # Paced, so that flushes happen before the disk fills and some frames reach it first.
    done = _cli("run", "--engine", "twin", "--paced", "--json", "--db", db, "--sessions", "200",
                "--duration", "6", "--pool-blocks", "8192", limit_files=True)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "failed" and "File too large" in summary["reason"], summary
    errors = [line for line in done.stderr.splitlines() if line.startswith("metronome: error:")]
    assert len(errors) == 1 and "store could not write" in errors[0], done.stderr[-2000:]
    store = Store(db)  # no file limit here: the file opens, what was written is there
    try:
        cur = store.cursor()
        status, reason = cur.execute("SELECT status, reason FROM runs WHERE run_id = ?",
                                     [summary["run_id"]]).fetchone()
        frames = cur.execute("SELECT count(*) FROM frames WHERE run_id = ?",
                             [summary["run_id"]]).fetchone()[0]
    finally:
        store.close()
    # The run's end is one small statement after the disk filled: it gets through when the
    # file that hit the limit was the database, not the WAL (1 in 2 seen here alone); when it
    # cannot, the next open marks the run aborted. Never 'running', never 'finished'.
    assert (status == "failed" and "File too large" in reason) or status == "aborted", \
        (status, reason)
    assert 0 < frames < summary["frames"], (frames, summary)
    lost = summary["rows_lost"]
    assert frames + lost >= summary["frames"]  # nothing vanished without a count


@pytest.fixture
def held(tmp_path):
    """A database held open by another process (DuckDB allows one writer process a file)."""
    db = str(tmp_path / "held.duckdb")
    con = duckdb.connect(db)
    con.execute("CREATE TABLE marker AS SELECT 42 AS x")
    con.close()
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; "
                               "c = duckdb.connect(sys.argv[1]); print('ready', flush=True); "
                               "time.sleep(60)", db], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready"
    yield db, holder
    holder.kill()
    holder.wait(10)


def test_a_database_locked_by_another_process_is_refused_in_one_line(held):
    """Another process holds the lock. Must survive: that process's database (untouched), our
    process (a StoreError, one line naming the holder's pid; the CLI exits 2 with one line),
    and once the holder is gone the file opens with its data."""
    db, holder = held
    with pytest.raises(StoreError) as err:
        Store(db)
    assert "in use by process" in str(err.value) and str(holder.pid) in str(err.value)
    assert "\n" not in str(err.value)
    done = _cli("runs", "--db", db, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "in use by process" in done.stderr
    holder.kill()
    holder.wait(10)
    time.sleep(0.1)
    store = Store(db)
    try:
        assert store.cursor().execute("SELECT x FROM marker").fetchone() == (42,)
    finally:
        store.close()
