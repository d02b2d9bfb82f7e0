"""What the store writer's batches do to a thread that needs the GIL (issue 39): the wake-up lag
of a probe thread (it sleeps 1 ms and measures how late it runs again, as the engine's loop
thread must run when vLLM's output arrives) while the writer inserts a run's batches, beside
the same probe with the writer idle.

The rows are a real run's: a twin run (unpaced) of `--sessions` sessions at 80 ms frames,
collected by an observer; each 0.5 s of them (the writer's batch) is handed to a live
StoreWriter at the pace the run made them, `--runs` times, alternating with idle stretches.
Printed per condition: the probe's lag p50, p99 and max (ms), and the writer's CPU seconds per
second of run (its thread's own CPU time). A wake-up is late by the OS's scheduling as well,
so only the difference between the writer busy and idle is the writer's.

    .venv/bin/python benchmarks/writer_gil.py [--sessions 8] [--seconds 6] [--runs 3]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Rows:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict]] = []

    def observe(self, table: str, row: dict) -> None:
        self.rows.append((table, dict(row)))


def run_rows(sessions: int, seconds: float) -> list[tuple[float, str, dict]]:
    """(run time, table, row) of a twin run, in the order the run made them."""
    from runtime import RunConfig, Runner, make_engine
    from store import Store

    config = RunConfig(engine="twin", model="tiny", policy="window", window=128,
                       pool_blocks=4096, frame_ms=80.0, duration_s=seconds, load="fixed",
                       sessions=sessions, paced=False)
    rows = _Rows()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(os.path.join(tmp, "src.duckdb"))
        try:
            Runner(config, make_engine(config, store), store, observers=[rows]).run()
        finally:
            store.close()
    return [(float(r.get("t_submit", r.get("t", 0.0)) or 0.0), table, r)
            for table, r in rows.rows if table in ("frames", "ticks", "events")]


def _probe(stop: threading.Event, lags: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        time.sleep(0.001)
        lags.append((time.perf_counter() - t - 0.001) * 1e3)


def measure(rows, seconds: float, busy: bool) -> dict:
    """The probe's lags while the writer takes `rows` at their pace (busy) or nothing."""
    from store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(os.path.join(tmp, "gil.duckdb"))
        lags: list[float] = []
        stop = threading.Event()
        probe = threading.Thread(target=_probe, args=(stop, lags), name="probe")
        cpu0 = _thread_cpu(store.writer)
        t0 = time.perf_counter()
        probe.start()
        i = 0
        while time.perf_counter() - t0 < seconds:
            now = time.perf_counter() - t0
            while busy and i < len(rows) and rows[i][0] <= now:
                store.writer.add(rows[i][1], rows[i][2])
                i += 1
            time.sleep(0.005)
        stop.set()
        probe.join()
        store.writer.flush()
        cpu = _thread_cpu(store.writer) - cpu0
        store.close()
    lags.sort()
    return {"p50": lags[len(lags) // 2], "p99": lags[int(0.99 * (len(lags) - 1))],
            "max": lags[-1], "writer_cpu_s_per_s": cpu / seconds}


def _thread_cpu(writer) -> float:
    """The writer thread's CPU seconds (Linux: /proc/self/task/<tid>/stat, utime + stime)."""
    tid = writer._thread.native_id
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--switch-ms", type=float, nargs="+", default=[None],
                    help="sys.setswitchinterval values to compare (default: the interpreter's)")
    args = ap.parse_args()
    rows = run_rows(args.sessions, args.seconds)
    out: dict = {"sessions": args.sessions, "rows": len(rows), "runs": args.runs,
                 "load_avg_1m": round(os.getloadavg()[0], 2)}
    default = sys.getswitchinterval()
    switches = [default if s is None else s / 1e3 for s in args.switch_ms]
    results: dict = {}
    for _ in range(args.runs):  # interleaved: the machine's load moves
        for switch in switches:
            sys.setswitchinterval(switch)
            for kind in ("busy", "idle"):
                results.setdefault(f"{kind} switch {switch * 1e3:g} ms", []).append(
                    measure(rows, args.seconds, kind == "busy"))
    sys.setswitchinterval(default)
    for kind, runs in results.items():
        out[kind] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
