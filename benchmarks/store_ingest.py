"""Store ingest: rows per second into DuckDB through the writer (frames + ticks, each batch
with its rollups in one transaction), and what ingesting at a given rate does to the tick of a
paced run in the same process.

    .venv/bin/python benchmarks/store_ingest.py [--rows 2000000] [--rate 100000]
        [--rounds 2] [--duration-s 30]

1. Throughput: a producer hands the writer pre-built frame rows of 64 sessions at 80 ms (and
   their ticks, 1 per 64 frames) as fast as `add_many` takes them; rows/s is rows written over
   the time until the writer has flushed them all (frames + ticks; rollup rows reported
   beside). The producer's own cost is not counted: rows are built before the clock starts.
2. Tick overrun: a paced twin run (64 sessions, 80 ms frames, wall clock) on the same store,
   once with a feeder pushing `--rate` frame rows per second into the same writer (another
   run id) and once with the store idle; `--rounds` pairs, the order alternating. A tick's
   overrun is how far the run thread lags the wall clock; p99 per run, medians per kind and
   their ratio.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SESSIONS, FRAME_S = 64, 0.08


def frame_rows(run_id: str, n: int, start: int = 0) -> list[dict]:
    """Frame rows as the recorder writes them (every column), 64 sessions at 80 ms."""
    rows = []
    for i in range(start, start + n):
        k, s = divmod(i, SESSIONS)
        t = k * FRAME_S + s * FRAME_S / SESSIONS
        silent = i % 97 == 0
        lat = None if silent else 20.0 + (i * 7919 % 600) / 10.0
        rows.append({
            "run_id": run_id, "session_id": s, "frame_idx": k, "t_submit": t,
            "deadline": t + FRAME_S, "tokens_expected": 3, "skipped": False, "rank": None,
            "origin": "fixed", "t_first": None if silent else t + 0.01,
            "t_done": None if silent else t + lat / 1e3, "latency_ms": lat,
            "latency_bound_ms": 120.0 if silent else lat, "censored": silent,
            "naive_latency_ms": 120.0 if silent else lat, "tokens_out": 0 if silent else 3,
            "on_time": not silent and lat <= 80, "silent": silent, "complete": not silent,
            "naive_on_time": not silent and lat <= 80,
            "silent_cause": "compute" if silent else None})
    return rows


def tick_rows(run_id: str, n: int, start: int = 0) -> list[dict]:
    return [{"run_id": run_id, "tick": k, "t": k * FRAME_S, "live": SESSIONS,
             "limit_sessions": SESSIONS, "occupancy": 0.5, "used_blocks": 2048,
             "total_blocks": 4096, "running": SESSIONS, "waiting": 0, "paused": 0,
             "admitted": SESSIONS, "rejected": 0, "evicted": 0, "overrun_ms": 0.5,
             "tokens_out": 192, "frames_waiting": 0, "stalled": False, "p95_ms": 60.0,
             "silent_rate": 0.01, "tsat_s": None, "rho_slope_per_s": 0.0, "window_tokens": 128,
             "sink_tokens": 0} for k in range(start, start + n)]


def throughput(db: str, rows: int, per_row: bool, rollups: bool = True) -> dict:
    """`per_row`: one add() per row, as the recorder hands them over (else add_many of 64
    frames and their tick at a time); `rollups` False: the same writer with rollups switched
    off, the baseline they cost against."""
    from store import Store
    from store import rollups as rollup_module

    saved = rollup_module.ROLLED
    rollup_module.ROLLED = saved if rollups else {}
    store = Store(db)
    frames = frame_rows("ingest", rows)
    ticks = tick_rows("ingest", rows // SESSIONS)
    t0 = time.perf_counter()
    for k in range(0, rows // SESSIONS):
        chunk = frames[k * SESSIONS:(k + 1) * SESSIONS]
        if per_row:
            for row in chunk:
                store.writer.add("frames", row)
            store.writer.add("ticks", ticks[k])
        else:
            store.writer.add_many("frames", chunk)
            store.writer.add_many("ticks", ticks[k:k + 1])
    handed = time.perf_counter() - t0
    store.writer.flush(timeout=3600)
    elapsed = time.perf_counter() - t0
    cur = store.cursor()
    rollup_rows = sum(cur.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                      for t in ("frame_rollups", "latency_rollups", "wall_rollups",
                                "tick_rollups"))
    health = store.writer.health()
    store.close()
    rollup_module.ROLLED = saved
    written = rows + len(ticks)
    return {"add": "per row" if per_row else "64 frames + 1 tick per add_many",
            "rollups": rollups, "rows": written, "frames": rows, "ticks": len(ticks),
            "seconds": round(elapsed, 2),
            "handed_over_s": round(handed, 2), "rows_per_s": round(written / elapsed),
            "rollup_rows_after_compaction": rollup_rows, "rows_lost": health["rows_lost"],
            "db_mb": round(os.path.getsize(db) / 2**20, 1)}


_FEED: dict = {}


def _feeder(store, rate: float, stop: threading.Event, fed: list) -> None:
    """Push `rate` rows per second (frames, and their ticks: 65 rows per 64 frames) in
    20 ms slices of 64-frame add_many calls; the rows are built once, before the run (their
    building is the producer's cost, not the store's), and sent again and again."""
    if not _FEED:
        _FEED["frames"] = frame_rows("feeder", 64 * 3000)
        _FEED["ticks"] = tick_rows("feeder", 3000)
    frames, ticks = _FEED["frames"], _FEED["ticks"]
    k = sent = 0
    t0 = time.perf_counter()
    while not stop.is_set():
        for _ in range(max(1, int(rate * 0.02 / (SESSIONS + 1)))):
            j = k % len(ticks)
            store.writer.add_many("frames", frames[j * SESSIONS:(j + 1) * SESSIONS])
            store.writer.add_many("ticks", ticks[j:j + 1])
            k, sent = k + 1, sent + SESSIONS + 1
        ahead = t0 + sent / rate - time.perf_counter()
        if ahead > 0:
            stop.wait(ahead)
    fed.append(sent / (time.perf_counter() - t0))


def _paced_run(db: str, duration_s: float, rate: float | None) -> dict:
    from runtime import RunConfig, execute
    from store import open_store

    store = open_store(db)
    stop, fed = threading.Event(), []
    feeder = None
    if rate:
        feeder = threading.Thread(target=_feeder, args=(store, rate, stop, fed), daemon=True)
        feeder.start()
    cpu0 = time.process_time()
    try:
        summary = execute(RunConfig(engine="twin", paced=True, sessions=SESSIONS,
                                    pool_blocks=4096, policy="window", window=128,
                                    duration_s=duration_s), store)
    finally:
        stop.set()
        if feeder is not None:
            feeder.join(30)
    cpu_s = time.process_time() - cpu0
    store.writer.flush(timeout=600)
    q = store.cursor().execute(
        "SELECT quantile_cont(overrun_ms, [0.5, 0.95, 0.99]), max(overrun_ms), count(*) "
        "FROM ticks WHERE run_id = ? AND t >= 2.0", [summary.run_id]).fetchone()
    return {"store": "ingesting" if rate else "idle", "fed_rows_per_s": round(fed[0]) if fed
            else 0, "ticks": q[2], "p50_ms": round(q[0][0], 2), "p95_ms": round(q[0][1], 2),
            "p99_ms": round(q[0][2], 2), "max_ms": round(q[1], 2),
            "process_cpu_s_per_s": round(cpu_s / duration_s, 2),
            "run_rows_lost": summary.rows_lost}


def tick_overrun(db: str, rate: float, rounds: int, duration_s: float) -> dict:
    runs = []
    for r in range(rounds):
        order = (rate, None) if r % 2 == 0 else (None, rate)
        runs.extend(_paced_run(db, duration_s, x) for x in order)
    med = {kind: statistics.median(x["p99_ms"] for x in runs if x["store"] == kind)
           for kind in ("idle", "ingesting")}
    return {"runs": runs, "median_p99_idle_ms": med["idle"],
            "median_p99_ingesting_ms": med["ingesting"],
            "p99_ratio_ingesting_over_idle": round(med["ingesting"] / med["idle"], 2)
            if med["idle"] else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rate", type=float, default=100_000.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--skip-overrun", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"load_avg_at_start": os.getloadavg(), "throughput": [
            throughput(str(Path(tmp) / f"ingest{i}.duckdb"), args.rows, per_row, rollups)
            for i, (per_row, rollups) in enumerate(
                [(True, True), (False, True), (True, False), (False, False)])]}
        if not args.skip_overrun:
            result["tick_overrun"] = tick_overrun(str(Path(tmp) / "paced.duckdb"), args.rate,
                                                  args.rounds, args.duration_s)
        result["load_avg_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
