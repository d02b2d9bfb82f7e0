"""SIGKILL in the middle of a run: what was flushed survives, the run is marked aborted."""

import os
import signal
import subprocess
import sys
import time

import pytest

from store import Store, rollup_build
from store.writer import FLUSH_INTERVAL_S

pytestmark = pytest.mark.slow


def test_kill_mid_run_keeps_flushed_frames_and_marks_the_run_aborted(tmp_path):
    db = str(tmp_path / "crash.duckdb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", "--engine", "twin", "--paced", "--json",
         "--db", db, "--sessions", "8", "--policy", "window", "--window", "128",
         "--pool-blocks", "128", "--frame-ms", "80", "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(4.0)  # startup (~1-2 s) + a few seconds of frames
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    store = Store(db)  # reopening marks the orphan and must not raise
    try:
        cur = store.cursor()
        run_id, status, reason, started, ended = cur.execute(
            "SELECT run_id, status, reason, started_at, ended_at FROM runs").fetchone()
        assert status == "aborted" and "process ended" in reason
        last_tick = cur.execute("SELECT max(t) FROM ticks WHERE run_id = ?", [run_id]).fetchone()[0]
        assert last_tick > 0.5 and ended is not None
        assert abs((ended - started).total_seconds() - last_tick) < 0.01  # ended = last tick
        # Every frame period up to the last flush is complete: 8 sessions per 80 ms tick, and
        # at most one flush interval (plus the frame in flight) can be missing at the end.
        frames = cur.execute("SELECT count(*), max(t_submit) FROM frames WHERE run_id = ?",
                             [run_id]).fetchone()
        assert frames[0] >= 8 * int((last_tick - FLUSH_INTERVAL_S - 0.16) / 0.08)
        per_tick = cur.execute(
            "SELECT count(*) FROM frames WHERE run_id = ? GROUP BY frame_idx "
            "HAVING max(t_submit) < ? ORDER BY 1", [run_id, frames[1] - 0.2]).fetchall()
        assert per_tick and all(n == 8 for (n,) in per_tick)  # no hole before the tail
        # The rollups hold exactly the frames and ticks that reached the disk.
        assert set(rollup_build.differences(cur, run_id).values()) == {0}
        assert rollup_build.rolled_up(cur, run_id)
    finally:
        store.close()

    # A new run starts cleanly on the same file.
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--engine", "twin", "--json", "--db", db,
         "--sessions", "4", "--duration", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    check = Store(db)
    try:
        statuses = dict(check.cursor().execute("SELECT status, count(*) FROM runs GROUP BY 1")
                        .fetchall())
    finally:
        check.close()
    assert statuses == {"aborted": 1, "finished": 1}
