"""The CLI for replay, schedules, the headless scheduler and retention (twin only)."""

import json
import subprocess
import sys

import duckdb


def _metronome(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, timeout=timeout)


def _error_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("metronome: error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_replay_a_recorded_cliff_with_a_window_from_the_cli(tmp_path):
    db = str(tmp_path / "r.duckdb")
    cliff = _metronome("run", "--engine", "twin", "--json", "--db", db, "--pool-blocks", "64",
                       "--sessions", "10", "--frame-ms", "160", "--duration", "6", "--seed", "3")
    assert cliff.returncode == 0, cliff.stderr
    original = json.loads(cliff.stdout)
    assert original["stalled"]
    # Only the settings to change are given: frame period, sessions, duration and seed follow
    # the recording.
    replay = _metronome("run", "--engine", "twin", "--json", "--db", db, "--pool-blocks", "64",
                        "--load", "replay", "--replay-run", original["run_id"],
                        "--policy", "window", "--window", "128")
    assert replay.returncode == 0, replay.stderr
    windowed = json.loads(replay.stdout)
    assert not windowed["stalled"] and windowed["frame_ms"] == 160.0
    assert windowed["sessions_offered"] == 10
    con = duckdb.connect(db, read_only=True)
    # The same frames, except that a frame submitted at 5.92 s, with its deadline after the
    # run's end, is recorded when the stalled run skipped it but not when it was answered.
    keys = ("SELECT session_id, frame_idx FROM frames WHERE run_id = ? AND deadline <= 6.0 "
            "ORDER BY 1, 2")
    assert con.execute(keys, [windowed["run_id"]]).fetchall() == \
        con.execute(keys, [original["run_id"]]).fetchall()
    assert len(con.execute(keys, [windowed["run_id"]]).fetchall()) == 370
    con.close()

    wrong = _metronome("run", "--engine", "twin", "--db", db, "--load", "replay",
                       "--replay-run", original["run_id"], "--frame-ms", "80")
    assert wrong.returncode == 2
    assert "frame period 80 ms differs from run" in _error_line(wrong)
    missing = _metronome("run", "--engine", "twin", "--db", db, "--load", "replay")
    assert missing.returncode == 2 and "needs exactly one of --replay-run" in _error_line(missing)


def test_schedules_from_the_cli_and_the_headless_scheduler(tmp_path):
    db = str(tmp_path / "s.duckdb")
    settings = json.dumps({"engine": "twin", "pool_blocks": 64, "sessions": 6,
                           "duration_s": 3.0})
    added = _metronome("schedule", "add", "--db", db, "--name", "canary", "--kind", "canary",
                       "--every", "1", "--settings", settings)
    assert added.returncode == 0, added.stderr
    schedule_id = added.stdout.strip()
    bad = _metronome("schedule", "add", "--db", db, "--name", "x", "--kind", "canary",
                     "--cron", "61 * * * *")
    assert bad.returncode == 2 and "cron '61 * * * *'" in _error_line(bad)

    run = _metronome("scheduler", "--db", db, "--for", "3.5")
    assert run.returncode == 0, run.stderr
    listing = _metronome("schedule", "list", "--db", db)
    assert f"{schedule_id}  canary · canary · every 1 s  last fire: N* — t_sat 1." in \
        listing.stdout
    con = duckdb.connect(db, read_only=True)
    fires = con.execute("SELECT status, run_ids FROM schedule_fires WHERE schedule_id = ?",
                        [schedule_id]).fetchall()
    # Every run the fires started, whatever the fire's own status (on a loaded machine a fire
    # can end late or overrun and still leave its run): the archive takes them all.
    runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    con.close()
    finished = [json.loads(ids) for status, ids in fires if status == "finished"]
    assert len(finished) >= 2, fires

    assert _metronome("schedule", "pause", schedule_id, "--db", db).returncode == 0
    assert "paused canary" in _metronome("schedule", "list", "--db", db).stdout
    assert _metronome("schedule", "remove", schedule_id, "--db", db).returncode == 0
    assert _metronome("schedule", "list", "--db", db).stdout.strip() == "no schedules"
    gone = _metronome("schedule", "resume", schedule_id, "--db", db)
    assert gone.returncode == 2 and "does not exist" in _error_line(gone)

    archived = _metronome("archive", "--older-than-days", "0.00001", "--db", db)
    assert archived.returncode == 0, archived.stderr
    assert archived.stdout.count(" archived ") == runs >= len(finished)
