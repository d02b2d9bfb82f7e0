"""What one flush of the store writer costs in CPU (issue 39), rollup deltas by SQL
(`rollups.delta_sql`, one planned statement per rollup table) against in Python
(store/rollup_deltas.py, one plain INSERT each), side by side.

The rows are a real run's (benchmarks/writer_gil.py's twin run at 80 ms frames, frames, ticks
and events), cut into the writer's batches (FLUSH_INTERVAL_S of run time each) and inserted
the way the writer does (store.maintainer.Maintainer.insert per table: the rows, their rollups
and stall ends, one transaction each) on this thread, with DuckDB at one thread, so that this
thread's CPU time is the flush's whole cost. `--runs` runs, the two ways interleaved, a fresh
database each. Printed per sessions and way: the median CPU ms of one flush, the CPU ms per
second of run, and the ratio of the medians (Python / SQL).

    .venv/bin/python benchmarks/writer_flush.py [--sessions 1 8 64] [--seconds 6] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["METRONOME_DB_THREADS"] = "1"  # DuckDB works on the calling thread: its CPU is ours

WAYS = ("sql", "python")


def batches(rows, interval_s: float) -> list[dict[str, list[dict]]]:
    """The rows as the writer's flushes would hold them: per interval of run time, by table."""
    out: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for t, table, row in rows:
        out[int(t // interval_s)][table].append(row)
    return [out[k] for k in sorted(out)]


def flush_cpu_ms(flushes, way: str) -> list[float]:
    """The CPU ms of each flush, inserted into a fresh database with rollups by `way`."""
    from store import Store, maintainer

    python_deltas = maintainer.rollup_deltas

    def refuse(con, table, rows):  # the writer's SQL fallback, taken for every batch
        raise TypeError("benchmark: rollups by SQL")

    maintainer.rollup_deltas = (python_deltas if way == "python"
                                else types.SimpleNamespace(insert=refuse))
    out = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(os.path.join(tmp, "flush.duckdb"))
            writer_side = maintainer.Maintainer()
            try:
                for flush in flushes:
                    def one(con, flush=flush):
                        cpu = time.thread_time()
                        for table in sorted(flush, key=lambda name: name == "ticks"):
                            writer_side.insert(con, table, flush[table])
                        return (time.thread_time() - cpu) * 1e3
                    out.append(store.writer.call(one))
            finally:
                store.close()
    finally:
        maintainer.rollup_deltas = python_deltas
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.runs < 1 or args.seconds <= 0 or min(args.sessions) < 1:
        parser.error("--runs and --sessions must be ≥ 1 and --seconds > 0")
    from store.writer import FLUSH_INTERVAL_S
    from writer_gil import run_rows

    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; DuckDB 1 thread; "
          f"flushes of {FLUSH_INTERVAL_S} s of a twin run's rows; {args.runs} run(s)")
    print("| sessions | rows a flush | SQL ms a flush | Python ms a flush | ratio | "
          "SQL ms per s of run | Python ms per s of run |")
    print("|---|---|---|---|---|---|---|")
    for n in args.sessions:
        flushes = batches(run_rows(n, args.seconds), FLUSH_INTERVAL_S)
        per_flush = {way: [] for way in WAYS}
        per_s = {way: [] for way in WAYS}
        for _ in range(args.runs):
            for way in WAYS:
                ms = flush_cpu_ms(flushes, way)
                per_flush[way].append(statistics.median(ms))
                per_s[way].append(sum(ms) / args.seconds)
        rows = statistics.median(sum(map(len, f.values())) for f in flushes)
        sql, py = (statistics.median(per_flush[w]) for w in WAYS)
        print(f"| {n} | {rows:.0f} | {sql:.1f} | {py:.1f} | {py / sql:.2f} | "
              f"{statistics.median(per_s['sql']):.0f} | {statistics.median(per_s['python']):.0f} |")
    print(f"after: load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
