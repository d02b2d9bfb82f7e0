"""Live page cost: its queries over a long run (rollups), and its refresh while a run writes.

    .venv/bin/python benchmarks/live_page.py [--frames 10000000] [--repeats 20]
        [--source synthetic|twin] [--baseline-repeats 3] [--refresh-s 0]

1. Makes a run of N frame rows, 64 sessions at 80 ms frames: `synthetic` (default) writes the
   frames, ticks and events straight into the store with DuckDB SQL (benchmarks/synth_run.py,
   seconds instead of the twin's ~12k frames/s), with no rollups, and rolls them up through
   the path a run recorded before rollups takes on first open (`ensure_rollups`, timed);
   `writer` hands the same synthetic rows to the store's writer one run-second per batch, as
   a live run does (its rollups written and compacted as it goes: the layout a recorded run
   leaves); `twin` records a twin run.
2. Times `services.live_data.live_data` (every query one Live refresh makes): a viewer's first
   refresh (no per-viewer cache) and its later refreshes while the run is live (settled
   buckets cached), p50/p95/max over --repeats; and, side by side on the same file, the same
   refresh over the raw rows as the page made it before rollups (`raw_refresh`, the exact
   queries of store/queries.py) over --baseline-repeats.
3. With --refresh-s > 0: starts a paced twin run (64 sessions, 80 ms) through the console's
   run host and re-renders the whole Live page (AppTest) back to back while it writes.
Prints one JSON object; results go to docs/BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "p50_ms": round(statistics.median(xs) * 1e3, 1),
            "p95_ms": round(xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)] * 1e3, 1),
            "max_ms": round(xs[-1] * 1e3, 1)}


def raw_refresh(cur, row: dict) -> None:
    """The Live refresh as it was before rollups: every chart from the raw frames and ticks
    (store/queries.py, exact percentiles), 1 s buckets made coarser by ceil(span/300)."""
    from store import queries, rank_queries

    run_id = row["run_id"]
    bucket = float(max(1, math.ceil(float(row["duration_s"]) / 300)))
    queries.latest_tick(cur, run_id)
    queries.frame_buckets(cur, run_id, bucket)
    queries.session_wall(cur, run_id, bucket)
    queries.settings_history(cur, run_id)
    queries.stall_spans(cur, run_id)
    queries.tsat_prediction(cur, run_id)
    queries.tick_buckets(cur, run_id, bucket)
    rank_queries.rank_buckets(cur, run_id, bucket)


def _make_run(store, frames: int, source: str) -> tuple[dict, dict]:
    from services.live_data import ensure_rollups
    from benchmarks.synth_run import synthesise
    from runtime import RunConfig, execute
    from store import queries

    made: dict = {"source": source}
    t = time.perf_counter()
    if source == "synthetic":
        row = store.writer.call(lambda con: synthesise(con, "synthetic", frames), timeout=7200)
        made["synthesise_s"] = round(time.perf_counter() - t, 1)
        steps: list = []
        t = time.perf_counter()
        ensure_rollups(store, row["run_id"], progress=lambda f: steps.append(
            round(time.perf_counter() - t, 2)))
        made["first_open_rollup_s"] = round(time.perf_counter() - t, 1)
        made["first_open_progress_updates"] = len(steps)
        run_id = row["run_id"]
    elif source == "writer":
        run_id, made["feed_s"] = _feed_through_writer(store, frames)
    else:
        summary = execute(RunConfig(engine="twin", sessions=64, pool_blocks=4096,
                                    policy="window", window=128,
                                    duration_s=frames / (64 * 12.5)), store)
        store.writer.flush(timeout=3600)
        made["record_s"] = round(time.perf_counter() - t, 1)
        run_id = summary["run_id"]
    cur = store.cursor()
    made["frames"] = cur.execute("SELECT count(*) FROM frames WHERE run_id = ?",
                                 [run_id]).fetchone()[0]
    made["ticks"] = cur.execute("SELECT count(*) FROM ticks WHERE run_id = ?",
                                [run_id]).fetchone()[0]
    for table in ("frame_rollups", "latency_rollups", "wall_rollups", "tick_rollups"):
        made[f"{table}_rows"] = cur.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?",
                                            [run_id]).fetchone()[0]
    made["db_mb"] = round(os.path.getsize(store.path) / 2**20)
    return queries.run_row(cur, run_id), made


def _feed_through_writer(store, frames: int) -> tuple[str, float]:
    """The synthetic run written the way a live one is: its frames and ticks handed to the
    writer one run-second at a time, each second one batch (frames + rollups in one
    transaction), compaction every 10 s of run; the rollup layout a recorded run leaves."""
    import duckdb

    from benchmarks.synth_run import synthesise
    from store import rollups
    from store.schema import MIGRATIONS, SCHEMA

    scratch = duckdb.connect()
    scratch.execute(SCHEMA)
    scratch.execute(MIGRATIONS)
    row = synthesise(scratch, "fed", frames)
    store.writer.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES "
                         f"({', '.join('?' for _ in row)})", list(row.values()))
    t0 = time.perf_counter()
    seconds = int(math.ceil(row["duration_s"]))
    maintainer = store.writer._rollups
    for s in range(seconds):
        for table, t in (("frames", "t_submit"), ("ticks", "t")):
            rows = scratch.execute(f"SELECT * FROM {table} WHERE {t} >= ? AND {t} < ?",
                                   [float(s), s + 1.0]).df().to_dict("records")
            store.writer.add_many(table, rows)
        store.writer.flush(timeout=600)  # this second's rows: one batch per table
        if s % 10 == 9:  # a compaction every 10 s of run, as a live run gets
            store.writer.call(lambda con: maintainer.maybe_compact(con, force=True))
    store.writer.flush(timeout=600)
    return "fed", round(time.perf_counter() - t0, 1)


def queries_over_big_run(db: str, frames: int, repeats: int, baseline_repeats: int,
                         source: str, memory_limit: str) -> dict:
    from services import live_data as ld
    from store import open_store

    store = open_store(db)
    store.writer.call(lambda con: con.execute(f"SET memory_limit = '{memory_limit}'"))
    row, made = _make_run(store, frames, source)
    cur = store.cursor()
    cold, warm, raw = [], [], []
    for _ in range(repeats):
        t = time.perf_counter()
        data = ld.live_data(cur, row)  # no cache: a viewer's first refresh
        cold.append(time.perf_counter() - t)
    # A viewer's later refreshes while the run is live (its row says running): settled buckets
    # come from the viewer's cache, only the last seconds are read again.
    live_row = {**row, "status": "running"}
    cache: dict = {}
    ld.live_data(cur, live_row, cache)
    for _ in range(repeats):
        t = time.perf_counter()
        ld.live_data(cur, live_row, cache)
        warm.append(time.perf_counter() - t)
    for _ in range(baseline_repeats):
        t = time.perf_counter()
        raw_refresh(cur, row)
        raw.append(time.perf_counter() - t)
    out = {**made, "bucket_s": data.bucket_s, "chart_points": len(data.frames),
           "wall_cells": len(data.wall), "first_refresh": _quantiles(cold),
           "live_refresh": _quantiles(warm)}
    if raw:
        out["raw_first_refresh_before_rollups"] = _quantiles(raw)
        out["speedup_first_refresh_p50"] = round(statistics.median(raw)
                                                 / statistics.median(cold), 1)
    store.close()
    return out


def refresh_while_writing(db: str, seconds: float) -> dict:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from console.shell import run_host
    from runtime import RunConfig
    from store import open_store, queries

    host = run_host()
    run_id = host.start(RunConfig(engine="twin", paced=True, sessions=64, pool_blocks=4096,
                                  policy="window", window=128, duration_s=seconds + 10), db)
    at = AppTest.from_file(str(ROOT / "streamlit_app.py"), default_timeout=30).run()
    time.sleep(3)  # let the run write a few seconds first
    renders, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        at.run()
        renders.append(time.perf_counter() - t)
        assert not at.exception, at.exception
    host.stop()
    host.close()
    frames = queries.frame_counts(open_store(db).cursor(), run_id)["frames"]
    st.cache_resource.clear()
    return {"run_frames_written": frames, **_quantiles(renders)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--baseline-repeats", type=int, default=3)
    parser.add_argument("--source", choices=("synthetic", "writer", "twin"),
                        default="synthetic")
    parser.add_argument("--refresh-s", type=float, default=0.0)
    parser.add_argument("--memory-limit", default="4GB", help="DuckDB's, for a shared machine")
    parser.add_argument("--dir", default=None, help="where the database goes (default: a "
                        "temporary folder, removed after)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        db = str(Path(tmp) / "bench.duckdb")
        result = {"load_avg_at_start": os.getloadavg(), "frames_asked": args.frames,
                  "live_queries": queries_over_big_run(db, args.frames, args.repeats,
                                                       args.baseline_repeats, args.source,
                                                       args.memory_limit)}
        if args.refresh_s > 0:
            os.environ["METRONOME_DB"] = str(Path(tmp) / "render.duckdb")
            result["live_page_render_while_writing"] = refresh_while_writing(
                os.environ["METRONOME_DB"], args.refresh_s)
        result["load_avg_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
