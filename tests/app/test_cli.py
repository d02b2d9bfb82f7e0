"""The CLI contract: bad input is one line naming the value; a twin run prints the JSON."""

import json
import subprocess
import sys

import pytest


def _metronome(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, needle", [
    (["--policy", "window", "--window", "16"], "window 16 is smaller than one block (32 tokens)"),
    (["--policy", "window", "--window", "256", "--pool-blocks", "4"],
     "pool of 4 blocks is smaller than one session's window (9 blocks"),
    (["--model", "/nonexistent/model"], "model '/nonexistent/model' is not one of tiny, smollm2"),
    (["--frame-ms", "0"], "frame period 0.0 ms must be > 0"),
    (["--frame-ms", "-5"], "frame period -5.0 ms must be > 0"),
    (["--block-size", "16"], "block size 16 must be a positive multiple of 32"),
    (["--wait-budget", "1.5"], "wait budget 1.5 must be in (0, 1]"),
    (["--policy", "window"], "policy window needs --window"),
    (["--sessions", "0"], "sessions 0 must be in [1, 100000]"),
    (["--frame-ms", "abc"], "'abc' is not a number"),
    (["--db", "/nonexistent/dir/x.duckdb", "--engine", "twin"], "database folder /nonexistent/dir does not exist"),
])
def test_bad_input_is_one_line_naming_the_value(args, needle, tmp_path):
    r = _metronome("run", "--json", "--db", str(tmp_path / "x.duckdb"), *args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("metronome: error:")]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_twin_run_prints_exactly_one_json_object(tmp_path):
    r = _metronome("run", "--engine", "twin", "--json", "--db", str(tmp_path / "t.duckdb"),
                   "--pool-blocks", "64", "--sessions", "12", "--duration", "5")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["engine"] == "twin" and summary["simulated"] is True
    assert summary["stalled"] is True and summary["stall_at_s"] > 0
    listing = _metronome("runs", "--db", str(tmp_path / "t.duckdb"))
    assert summary["run_id"] in listing.stdout and "finished" in listing.stdout
