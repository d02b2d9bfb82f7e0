"""Live page cost: its queries over a 1M-frame run, and its refresh while a run writes.

    .venv/bin/python benchmarks/live_page.py [--frames 1000000] [--refresh-s 20]

1. Records a twin run of 64 sessions at 80 ms frames long enough for ~1M frame rows, then times
   `app.views.live_data` (every query one Live refresh makes) on it: a viewer's first refresh
   (every frame scanned) and its later refreshes while the run is live (settled buckets cached).
2. Starts a paced twin run (64 sessions, 80 ms frames, wall-clock time) through the console's
   run host and re-renders the whole Live page (AppTest, charts included) back to back while
   the run writes, reporting the render time: ≤ 1 s means the 1 Hz fragment keeps up.
Prints one JSON object; results go to docs/BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import logging
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
            "p95_ms": round(xs[int(0.95 * (len(xs) - 1))] * 1e3, 1),
            "max_ms": round(xs[-1] * 1e3, 1)}


def queries_over_big_run(db: str, frames: int, repeats: int) -> dict:
    from app import views
    from runtime import RunConfig, execute
    from store import open_store, queries

    store = open_store(db)
    duration = frames / (64 * 12.5)
    t = time.perf_counter()
    summary = execute(RunConfig(engine="twin", sessions=64, pool_blocks=4096, policy="window",
                                window=128, duration_s=duration), store)
    store.writer.flush(timeout=600)
    record_s = time.perf_counter() - t
    cur = store.cursor()
    row = queries.run_row(cur, summary["run_id"])
    cold, warm = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        views.live_data(cur, row)  # no cache: the first refresh of a viewer, every frame scanned
        cold.append(time.perf_counter() - t)
    # A viewer's later refreshes while the run is live (its row says running): settled buckets
    # come from the viewer's cache, only the last seconds are scanned again.
    live_row = {**row, "status": "running"}
    cache: dict = {}
    views.live_data(cur, live_row, cache)
    for _ in range(repeats):
        t = time.perf_counter()
        views.live_data(cur, live_row, cache)
        warm.append(time.perf_counter() - t)
    return {"frames": summary["frames"], "record_s": round(record_s, 1),
            "first_refresh": _quantiles(cold), "live_refresh": _quantiles(warm)}


def refresh_while_writing(db: str, seconds: float) -> dict:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from app.console import run_host
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
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--refresh-s", type=float, default=20.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.duckdb")
        os.environ["METRONOME_DB"] = db
        result = {"load_avg_at_start": os.getloadavg(),
                  "live_queries_1M": queries_over_big_run(db, args.frames, args.repeats),
                  "live_page_render_while_writing": refresh_while_writing(db, args.refresh_s)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
