"""What a reader costs the run that holds the database, and how fresh what it reads is.

    .venv/bin/python benchmarks/reader_cost.py [--runs 2] [--sessions 8] [--duration-s 15]
        [--reader-hz 5]

Each run is `metronome serve` (the paced twin, window W=128, 80 ms frames, fixed admission;
gateway_overhead.start_serve)
with `metronome load` driving its sessions, twice side by side: once with nobody reading, once
with a reader in another process reading through the holder (store/shared_reads.py) what
`metronome runs` and the Live page read — the runs list, the latest tick, the last frame
rollups — at `--reader-hz`. The order alternates between runs. Per run it prints the server's frame p50/p95,
its tick overruns and worst overrun, and for the reader the query round trip (p50/p95) and
freshness: how far behind the run's clock the newest tick it saw was (the writer's batch
period, 0.5 s, and the 1 s rollup bucket are its floor). Prints one JSON line per run, then medians per condition.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _reader(db: Path, hz: float, stop: threading.Event, out: dict) -> None:
    from store.shared_reads import holder_file, reader_for

    while not holder_file(str(db)).exists() and not stop.is_set():
        time.sleep(0.05)
    pid = json.loads(holder_file(str(db)).read_text())["pid"]
    store = reader_for(str(db), pid)
    cur = store.cursor()
    rtt, lag = [], []
    while not stop.is_set():
        t0 = time.perf_counter()
        runs = cur.execute("SELECT run_id, started_at, status FROM runs ORDER BY started_at "
                           "DESC LIMIT 100").fetchall()  # `metronome runs`
        if runs:
            run_id, started_at = runs[0][0], runs[0][1]
            tick = cur.execute("SELECT max(t_last) FROM tick_rollups WHERE run_id = ? AND "
                               "level_s = 1", [run_id]).fetchone()[0]  # the Live header's
            cur.execute("SELECT t, frames, silent FROM frame_rollups WHERE run_id = ? AND "
                        "level_s = 1 ORDER BY t DESC LIMIT 10", [run_id]).fetchall()
            rtt.append((time.perf_counter() - t0) * 1e3)
            if tick is not None:  # how far the newest tick it saw is behind the run's clock
                elapsed = time.time() - started_at.timestamp()
                lag.append(max(0.0, elapsed - tick))
        time.sleep(max(0.0, 1 / hz - (time.perf_counter() - t0)))
    out.update(rtt_ms=rtt, lag_s=lag)


def one_run(reading: bool, args, tmp: Path) -> dict:
    from gateway_overhead import _free_port, start_serve

    tmp.mkdir(parents=True)
    db, port = tmp / "server.duckdb", _free_port()
    env = {**os.environ, "METRONOME_LOG": "WARNING"}
    server, _err = start_serve(tmp, db, port, args.sessions)
    stop, seen = threading.Event(), {}
    reader = threading.Thread(target=_reader, args=(db, args.reader_hz, stop, seen))
    if reading:
        reader.start()
    subprocess.run([sys.executable, "-m", "cli.main", "load", "--url",
                    f"ws://127.0.0.1:{port}/v1/realtime", "--sessions", str(args.sessions),
                    "--duration", str(args.duration_s), "--no-store", "--json"],
                   cwd=ROOT, capture_output=True, text=True, env=env, check=True,
                   timeout=args.duration_s + 120)
    stop.set()
    if reading:
        reader.join()
    server.send_signal(signal.SIGTERM)
    out, _ = server.communicate(timeout=120)
    summary = json.loads(out)
    row = {"reading": reading, "frames": summary["frames"],
           "p50_ms": summary.get("p50_ms"), "p95_ms": summary.get("p95_ms"),
           "tick_overruns": summary.get("tick_overruns"),
           "max_overrun_ms": summary.get("max_overrun_ms"),
           "load_avg_1m": round(os.getloadavg()[0], 2)}
    if reading and seen.get("rtt_ms"):
        row.update(reads=len(seen["rtt_ms"]),
                   read_p50_ms=round(statistics.median(seen["rtt_ms"]), 2),
                   read_p95_ms=round(sorted(seen["rtt_ms"])[int(0.95 * len(seen["rtt_ms"]))], 2),
                   fresh_p50_s=round(statistics.median(seen["lag_s"]), 3) if seen["lag_s"]
                   else None)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--duration-s", type=float, default=15.0)
    ap.add_argument("--reader-hz", type=float, default=5.0)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for reading in ((False, True) if i % 2 == 0 else (True, False)):
                row = one_run(reading, args, Path(tmp) / f"{i}-{int(reading)}")
                print(json.dumps({"run": i, **row}), flush=True)
                rows.append(row)
    summary = {}
    for reading in (False, True):
        mine = [r for r in rows if r["reading"] == reading]
        keys = [k for k, v in mine[0].items() if isinstance(v, (int, float))
                and not isinstance(v, bool)]
        summary["with reader" if reading else "no reader"] = {
            k: statistics.median([r[k] for r in mine if r.get(k) is not None])
            for k in keys if any(r.get(k) is not None for r in mine)}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
