"""`metronome demo --json` end to end on real vLLM (tiny model): with this machine's calibration
(the test session's, stored in the demo's database as `metronome calibrate` would), run the
derived pair, and the story holds — a cliff and a clean slope, whatever the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_demo_calibrates_then_shows_a_cliff_and_a_clean_slope(tmp_path, vllm_machine):
    from store import Store, calibrations

    db = str(tmp_path / "demo.duckdb")
    seeded = Store(db)
    calibrations.save(seeded, vllm_machine.cal.as_row())  # the demo finds it: no recalibration
    seeded.close()
    # two runs with an engine start each
    # 12 s of demo rather than the default 18 (×4 at a 320 ms period): the cliff at a third of
    # the run still leaves two thirds silent, and the suite stays under its 15 minutes.
    done = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--json", "--db", db,
                           "--duration", "12"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
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
    assert not slope["stalled"] and slope["silent_rate"] <= 0.01, slope
    assert "went silent for every session" in result["story"]
