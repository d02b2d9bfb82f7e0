"""Fault injection at the inputs: corrupt and oversized traces, values the store's columns
cannot hold, scheduled changes that could never apply, a schedule whose trace was deleted, and
the CLI's one-line refusals.

Each case says in its docstring what must survive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import duckdb
import pytest

from cli import main as cli
from services.run_host import RunHost
from services.scheduler import SchedulerService, add_schedule
from services.schedule_specs import ScheduleSpec
from load_gen.trace_file import MAX_SESSIONS
from runtime import RunConfig, execute
from runtime.config import INT32_MAX, MIN_FRAME_MS
from runtime.trace_source import checked_trace
from store import open_store
from store import schedules as table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = "session_id,start_s,end_s,tokens_in,tokens_out\n"


def _trace(path, rows: int, sessions: int, tokens_in: str = "16") -> str:
    con = duckdb.connect()
    con.execute(f"COPY (SELECT i % {sessions} AS session_id, (i // {sessions}) * 0.08 AS start_s, "
                f"(i // {sessions}) * 0.08 + 0.08 AS end_s, {tokens_in} AS tokens_in, "
                f"4 AS tokens_out FROM range({rows}) t(i)) TO '{path}' (HEADER)")
    con.close()
    return str(path)


def _refused(trace: str) -> str:
    with pytest.raises(ValueError) as err:
        checked_trace(RunConfig(engine="twin", load="replay", replay_trace=trace))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_corrupt_traces_are_refused_in_one_line(tmp_path):
    """Garbage bytes, a bad value far past DuckDB's type-sniffing sample, a truncated Parquet
    file, a bad token count. Must survive: the process (a one-line ValueError, nothing
    started), and the file itself (read, never written)."""
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(os.urandom(4096))
    assert "trace file" in _refused(str(garbage))
    late = tmp_path / "late.csv"
    _trace(late, 50_000, 100)
    with open(late, "a") as f:
        f.write("7,1.0,1.08,sixteen,4\n")
    assert "cannot be read" in _refused(str(late))
    parquet = tmp_path / "cut.parquet"
    duckdb.connect().execute(f"COPY (SELECT 1 AS session_id, 0.0 AS start_s, 1.0 AS end_s, "
                             f"16 AS tokens_in, 4 AS tokens_out) TO '{parquet}' (FORMAT parquet)")
    parquet.write_bytes(parquet.read_bytes()[:40])
    assert "cannot be read" in _refused(str(parquet))
    big = tmp_path / "big.csv"
    big.write_text(HEADER + "1,0,1,16,4\n2,0,1,9000,4\n")
    assert "row 2: tokens_in 9000 must be in [1, 8192]" in _refused(str(big))
    assert big.read_text().count("\n") == 3


def test_the_session_cap_is_checked_before_anything_is_built(tmp_path):
    """A trace with twice the sessions allowed. Must survive: the process's memory (refused by
    the estimate, before any per-session state) and its time (a second or two)."""
    trace = _trace(tmp_path / "many.csv", 2 * MAX_SESSIONS, 2 * MAX_SESSIONS)
    t0 = time.monotonic()
    assert f"at most {MAX_SESSIONS}" in _refused(trace)
    assert time.monotonic() - t0 < 5


_PEAK = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[2])
from load_gen.trace_load import file_trace
import duckdb, pandas, pyarrow
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
trace = file_trace(sys.argv[1], 80.0)
print(json.dumps({"growth_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
                  "sessions": len(trace.sessions), "frames": trace.sessions[0].frames}))
"""


def test_a_large_trace_is_validated_in_bounded_memory(tmp_path):
    """1M per-frame rows of 50k sessions (the issue's 43 MB trace took 923 MB). Must survive:
    memory (growth under 200 MB; benchmarks/trace_memory.py measures a 1.2 GB file at 243 MB
    peak RSS in all) and every frame (each session's frame count is exact)."""
    trace = _trace(tmp_path / "large.csv", 1_000_000, 50_000)
    out = subprocess.run([sys.executable, "-c", _PEAK, trace, ROOT], capture_output=True,
                         text=True, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sessions"] == 50_000 and result["frames"] == 20
    assert result["growth_mb"] < 200, result


def test_values_at_the_columns_bounds_get_their_row_and_beyond_are_refused(store):
    """Seeds and pools at the 32-bit columns' limits. Must survive: the run's row (present,
    nothing lost); one past the limit is a one-line refusal before anything starts."""
    s = execute(RunConfig(engine="twin", sessions=2, duration_s=1.0, seed=INT32_MAX,
                          pool_blocks=INT32_MAX // 32), store)
    row = store.cursor().execute("SELECT seed, pool_blocks, status FROM runs WHERE run_id = ?",
                                 [s["run_id"]]).fetchone()
    assert row == (INT32_MAX, INT32_MAX // 32, "finished") and s["rows_lost"] == 0
    for bad, needle in ((dict(seed=INT32_MAX + 1), "seed 2147483648"),
                        (dict(pool_blocks=3_000_000_000), "pool blocks 3000000000"),
                        (dict(pool_blocks=2_000_000_000 // 32, data_parallel_size=2),
                         "must hold at most 2147483647 tokens"),
                        (dict(frame_ms=0.001), f"must be ≥ {MIN_FRAME_MS:g} ms")):
        with pytest.raises(ValueError, match=needle):
            RunConfig(engine="twin", **bad)


@pytest.mark.parametrize("change, needle", [
    ("1:target=5", "change target 5.0 must be in (0, 1]"),
    ("1:policy=bogus", "policy='bogus' is not one of"),
    ("1:window=-5", "window=-5 must be in [0,"),
    ("1:window=16", "window 16 is smaller than one block"),
    ("1:limit=pid", "limit='pid' is not one of"),
])
def test_scheduled_changes_that_could_never_apply_are_refused_before_the_run(change, needle,
                                                                            tmp_path, capsys):
    """Must survive: the database (no run row: the run never started) and the operator's
    attention (one line, exit 2)."""
    db = str(tmp_path / "c.duckdb")
    args = ["run", "--engine", "twin", "--db", db, "--policy", "window", "--window", "64",
            "--change", change]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not os.path.exists(db)


@pytest.mark.parametrize("args, needle", [
    (["archive", "--older-than-days", "inf"], "--older-than-days inf must be in"),
    (["scheduler", "--for", "inf"], "--for inf s must be in"),
    (["scheduler", "--for", "nan"], "--for nan s must be in"),
    (["scheduler", "--for", "-5"], "--for -5 s must be in"),
    (["runs", "--limit", "-1"], "limit -1 must be in"),
    (["report", "RUN", "--out", "/proc/metronome/r.html"], "does not exist"),
    (["runs", "--db", "TYPO"], "does not exist (check --db"),
    (["report", "RUN", "--out", "r.html", "--db", "TYPO"], "does not exist (check --db"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path, capsys):
    """Must survive: the database (a mistyped --db is not created empty) and the terminal
    (one line, no traceback)."""
    db = str(tmp_path / "real.duckdb")
    open_store(db).close()
    args = [a.replace("TYPO", str(tmp_path / "typo.duckdb")) for a in args]
    if "--db" not in args:
        args += ["--db", db]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not os.path.exists(tmp_path / "typo.duckdb")


def test_a_schedule_whose_trace_was_deleted_is_skipped_and_the_others_fire(tmp_path, capsys):
    """Must survive: the other schedules (they still fire), the listing (`schedule list` shows
    the bad one as INVALID), and the bad schedule's row (marked invalid, not deleted)."""
    db = str(tmp_path / "s.duckdb")
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "0,0,1,16,4\n")
    store = open_store(db)
    bad = add_schedule(store, ScheduleSpec("bad", "canary", every_s=3600, params={"settings": {
        "engine": "twin", "load": "replay", "replay_trace": str(trace)}}))
    good = add_schedule(store, ScheduleSpec("good", "canary", every_s=3600, params={
        "settings": {"engine": "twin", "sessions": 2, "duration_s": 1.0}}))
    trace.unlink()
    host = RunHost()
    service = SchedulerService(host, db, poll_s=0.02).start()
    try:
        assert "does not exist" in service.invalid[bad] and good not in service.invalid
        assert set(service.next_fire_times()) == {good}
        with pytest.raises(ValueError, match="is invalid"):
            service.fire_now(bad)
        service.fire_now(good)
        deadline = time.monotonic() + 30
        while not (table.fires(store.cursor(), good).status == "finished").any():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        service.shutdown()
        host.close()
    assert "does not exist" in table.schedule(store.cursor(), bad)["invalid"]
    store.close()
    assert cli.main(["schedule", "list", "--db", db]) == 0
    out = capsys.readouterr().out
    assert f"{bad}  INVALID bad" in out and f"{good}  good" in out
