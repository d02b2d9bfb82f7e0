"""Peak memory of reading and validating a replay trace file, and its extrapolation.

    .venv/bin/python benchmarks/trace_memory.py --rows 10000000 --sessions 100000
    .venv/bin/python benchmarks/trace_memory.py --rows 2000000 --varying   # per-frame tokens

Writes a per-frame CSV with DuckDB (no Python rows), then reads it with
`load_gen.trace_load.file_trace` in a fresh process and reports that process's peak RSS
(ru_maxrss) against the RSS of the same process after importing everything but before reading.
Measured (2 shared cores, DuckDB at 96 MB and one thread): 2M rows 216 MB, 10M rows 260 MB,
46M rows (a 1.2 GB file) 243 MB peak RSS, of which 116 MB is the interpreter with DuckDB,
pandas and pyarrow imported. `--rows 46000000` measures the 1 GB case directly (~1 min).
With tokens in varying per frame (--varying) each frame's count is kept, two bytes a frame:
10M rows 304 MB; a 1 GB file of that kind adds ~70 MB more (not measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
from load_gen.trace_load import file_trace
import duckdb, pandas, pyarrow  # what a run imports anyway
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.monotonic()
trace = file_trace(sys.argv[1], float(sys.argv[2]))
seconds = time.monotonic() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"base_mb": base, "peak_mb": peak, "seconds": seconds,
                  "sessions": len(trace.sessions)}))
"""


def write_csv(path: str, rows: int, sessions: int, varying: bool) -> int:
    import duckdb

    tokens = "1 + (i * 7919) % 64" if varying else "16"
    con = duckdb.connect()
    con.execute(f"""
        COPY (SELECT i % {sessions} AS session_id, (i // {sessions}) * 0.08 AS start_s,
                     (i // {sessions}) * 0.08 + 0.08 AS end_s, {tokens} AS tokens_in,
                     4 AS tokens_out, i // {sessions} AS frame_idx
              FROM range({rows}) t(i)) TO '{path}' (HEADER, DELIMITER ',')""")
    con.close()
    return os.path.getsize(path)


def measure(path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, path, "80", ROOT], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2_000_000, 10_000_000],
                        help="file sizes to measure, in rows (the last two give the slope)")
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--varying", action="store_true",
                        help="tokens in vary per frame (kept per frame: the worst case)")
    args = parser.parse_args()
    measured = []
    with tempfile.TemporaryDirectory(prefix="trace-memory-") as folder:
        for rows in args.rows:
            path = os.path.join(folder, f"trace-{rows}.csv")
            size = write_csv(path, rows, args.sessions, args.varying)
            r = measure(path)
            os.remove(path)
            measured.append({"rows": rows, "file_mb": round(size / 2**20, 1),
                             "base_mb": round(r["base_mb"], 1), "peak_mb": round(r["peak_mb"], 1),
                             "seconds": round(r["seconds"], 2)})
    out = {"sessions": args.sessions, "varying": args.varying, "measured": measured}
    # Not extrapolated linearly: DuckDB's share is capped by its memory limit, so the peak
    # flattens (2M rows: 216 MB, 10M: 260 MB, 46M = 1.2 GB: 243 MB); what does grow with rows
    # is only the per-frame tokens of sessions whose tokens vary, 2 bytes a frame.
    out["max_peak_mb"] = max(m["peak_mb"] for m in measured)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
