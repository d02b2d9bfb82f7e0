"""The demo's windowed run at a chosen compute limit: silent frames, and when they happened.

    .venv/bin/python benchmarks/demo_slope.py [--n-c 20] [--repeats 2] [--duration 12]

Calibrates this machine's vLLM once, then runs `metronome demo --json` `--repeats` times on a
database seeded with that calibration, its N_c at 80 ms replaced by `--n-c` when given (CI's
calibration said 20 where this machine usually measures 6-18: the demo then runs 10 sessions).
Prints each windowed run's silent share, p50/p95 and the half-seconds its silent frames fell in,
then the twin's skip figure for the frame backlog rule (runtime/backlog.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _twin_overload() -> dict:
    """runtime/backlog.py's twin case: 14 ms steps, 5 sessions, a 60 ms budget at 80 ms."""
    from engine.twin import CostModel, TwinEngine
    from runtime import RunConfig, Runner
    from store import Store

    store = Store(":memory:")
    cfg = RunConfig(policy="window", window=64, engine="twin", pool_blocks=256, sessions=5,
                    duration_s=4.0, frame_ms=80.0, budget_ms=60.0)
    s = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel(a_ms=14.0, b_ms_per_token=0.3)),
               store).run()
    skipped = store.cursor().execute("SELECT count(*) FILTER (WHERE skipped) FROM frames "
                                     "WHERE run_id = ?", [s["run_id"]]).fetchone()[0]
    store.close()
    return {"silent_rate": s["silent_rate"], "skipped": skipped, "frames": s["frames"]}


def main() -> int:
    import duckdb

    from services import calibration
    from store import Store, calibrations

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-c", type=int, default=None, help="N_c at 80 ms to seed (default: as "
                    "measured)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--duration", type=float, default=12.0)
    args = ap.parse_args()
    if args.repeats < 1 or (args.n_c is not None and not 1 <= args.n_c <= calibration.N_MAX):
        ap.error(f"--repeats must be ≥ 1 and --n-c in [1, {calibration.N_MAX}]")
    print(f"twin, overloaded (runtime/backlog.py): {json.dumps(_twin_overload())}")
    cal = calibration.calibrate("vllm", "tiny")
    print(f"calibrated: N_c {cal.periods} on {cal.machine}, dtype {cal.dtype}")
    if args.n_c is not None:
        cal = replace(cal, n_c=args.n_c, periods=((80.0, args.n_c),), frame_ms=80.0,
                      target_ms=calibration.TARGET_FRACTION * 80.0)
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            db = os.path.join(tmp, "demo.duckdb")
            seeded = Store(db)
            calibrations.save(seeded, cal.as_row())
            seeded.close()
            done = subprocess.run([sys.executable, "-m", "cli.main", "demo", "--json", "--db", db,
                                   "--duration", str(args.duration)], capture_output=True,
                                  text=True)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            result = json.loads(done.stdout)
            slope = result["runs"][1]
            with duckdb.connect(db, read_only=True) as con:
                where = con.execute(
                    "SELECT floor(t_submit * 2) / 2 AS s, count(*) FILTER (WHERE silent) "
                    "FROM frames WHERE run_id = ? GROUP BY 1 HAVING count(*) FILTER "
                    "(WHERE silent) > 0 ORDER BY 1", [slope["run_id"]]).fetchall()
        print(f"run {i + 1}: {result['settings']['sessions']} sessions at "
              f"{result['settings']['frame_ms']:g} ms, windowed {slope['silent_rate']:.2%} "
              f"silent of {slope['frames']} frames, p50 {slope['p50_ms']} ms, p95 "
              f"{'> budget' if slope['p95_censored'] else slope['p95_ms']} ms; silent at "
              f"(s, frames): {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
