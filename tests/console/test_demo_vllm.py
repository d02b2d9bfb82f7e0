"""`metronome demo --json` end to end on real vLLM (tiny model): with this machine's calibration
(the test session's, stored in the demo's database as `metronome calibrate` would), run the
derived pair, and the story holds — a cliff and a clean slope, whatever the machine. Then the
console script refits the twin from the demo's vLLM run and runs the twin on it (one engine
start fewer than a `metronome run --engine vllm` of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _metronome(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_demo_calibrates_then_shows_a_cliff_and_a_clean_slope(tmp_path, vllm_machine):
    from store import Store, calibrations

    db = str(tmp_path / "demo.duckdb")
    seeded = Store(db)
    calibrations.save(seeded, vllm_machine.cal.as_row())  # the demo finds it: no recalibration
    seeded.close()
    # two runs with an engine start each
    # 12 s of demo rather than the default 18 (×4 at a 320 ms period): the cliff at a third of
    # the run still leaves two thirds silent, and the suite stays under its 15 minutes.
    done = _metronome("demo", "--json", "--db", db, "--duration", "12", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    cliff, slope = result["runs"]
    assert result["calibration"] == vllm_machine.cal.as_dict()  # reused, not measured again
    assert result["settings"]["n_c"] >= 2 and result["settings"]["period_note"]
    assert (cliff["policy"], slope["policy"]) == ("unbounded", "window")
    assert cliff["stalled"], cliff
    with duckdb.connect(db, read_only=True) as con:  # the frames table, not the JSON
        n, silent = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE silent) FROM frames "
            "WHERE run_id = ? AND t_submit >= ?", [cliff["run_id"], cliff["stall_at_s"]]
        ).fetchone()
    assert n > 0 and silent / n >= 0.5, (silent, n)
    # The window never runs out of memory; what silence it has is compute noise, bounded by the
    # issue's 2 % (CI on a 2-core AVX2 EPYC measured 1.2 % of 1200 frames at N_c / 2 sessions).
    assert not slope["stalled"] and slope["silent_memory_frames"] == 0, slope
    assert slope["silent_rate"] <= 0.02, slope
    assert "went silent for every session" in result["story"]

    fit = _metronome("fit-twin", slope["run_id"], "--db", db, "--json")
    assert fit.returncode == 0, fit.stderr[-2000:]
    model = json.loads(fit.stdout)
    assert model["source_run_id"] == slope["run_id"] and model["n_steps"] >= 20
    twin = _metronome("run", "--engine", "twin", "--json", "--db", db, "--policy", "window",
                      "--window", "128", "--pool-blocks", "64", "--sessions", "6",
                      "--frame-ms", "160", "--duration", "4")
    assert twin.returncode == 0, twin.stderr[-2000:]
    sim = json.loads(twin.stdout)
    assert sim["simulated"] is True and sim["twin_cost_source"] == slope["run_id"]
    refused = _metronome("fit-twin", sim["run_id"], "--db", db)
    assert refused.returncode == 2 and "is simulated" in refused.stderr
