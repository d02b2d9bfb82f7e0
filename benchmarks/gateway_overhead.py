"""What the gateway adds to a frame, and how many sessions one gateway process holds.

    .venv/bin/python benchmarks/gateway_overhead.py [--sessions 1 8 32] [--runs 3]
        [--duration-s 10] [--ramp 32 64 128 256 512] [--bisect 2] [--workers 0] [--spread]

Every run is `metronome serve` (twin, paced, window W=128, 80 ms frames, fixed admission at
the run's session count, a fresh DuckDB file) in one process and `metronome load` (synthetic
speech, all sessions at once) in another, on loopback; the server is stopped by SIGTERM once
the client is done (serve then ends its run and writes its summary).

1. Overhead, side by side in one run: each frame the client sent is in both records (the
   server's `frames`, origin gateway; the client's, origin client), joined by the client's
   `open` events. The in-process path is the server's recorded latency of the frame (the
   tick's submission to its last token, on the engine clock: what a session of an in-process
   load gets from the same twin); the gateway path is what the client saw (the send of the
   append that completed the frame's audio to the delta that brought its last token). Per
   frame: overhead = gateway − in-process; the ratio is of the two p50s (and p95s). By design
   the overhead holds the inlet's jitter slack (`InletLimits.slack_s`, 30 ms: a frame starts
   that long after its audio is complete) and up to one poll (10 ms) before a token is sent.
2. Capacity: the same at growing session counts with a near-free twin step (a fitted model of
   a=0.2 ms + 0.001 ms/token written into the server's store), so the engine is never what
   limits: what is measured is the gateway process (run thread, event loop, store writer) and
   the load client sharing the machine. A count is clean when, after the first 2 s of each
   session, the server's record has no silent and no late frame, the client misses none and
   its p95 (send → last delta) is within the frame period. The ramp stops at the first count
   that is not clean (halving down when even the first is not), then bisects between it and
   the last clean one.
`--workers K`: serve with K gateway worker processes in front of the run (gateway/link.py);
0, one process. `--spread`: the client's sessions start evenly over one frame period, so
their frames complete at different phases (by default all start together and every session's
frame completes in the same millisecond: the worst case for a serial path). Each run's line
has the 1-minute load average at its start and end (the machine is shared). Prints one JSON
line per run, then the summary (medians over runs) as one JSON object.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FRAME_MS, WARM_UP_FRAMES = 80.0, 25  # 25 frames: a session's first 2 s are left out
CHEAP_TWIN = (0.2, 0.001, 0.0)  # a_ms, b_ms_per_token, c_ms_per_resident_token


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _seed_cheap_twin(db: Path) -> None:
    from store import open_store

    store = open_store(str(db))
    try:
        store.writer.execute("INSERT INTO twin_models VALUES (?, ?, ?, ?, ?, ?, ?)",
                             [dt.datetime.now(), "benchmark: near-free step", *CHEAP_TWIN,
                              1.0, 0])
        store.writer.flush(30.0)
    finally:
        store.close()


def start_serve(tmp: Path, db: Path, port: int, sessions: int, workers: int = 0):
    """`metronome serve` (the paced twin, W=128, 80 ms frames, a fixed cap at `sessions`) on
    `port`, listening; returns the process and its stderr file (in `tmp`). Shared by the
    gateway benchmarks (gateway_profile.py, reader_cost.py)."""
    err = open(tmp / "serve.err", "w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--engine", "twin", "--port", str(port),
         "--db", str(db), "--duration", "3600", "--policy", "window", "--window", "128",
         "--pool-blocks", str(max(256, 16 * sessions)), "--admission", "fixed", "--sessions",
         str(sessions), "--frame-ms", str(FRAME_MS), "--json",
         *(["--workers", str(workers)] if workers else [])],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
        env={**os.environ, "METRONOME_LOG": "WARNING"})
    deadline = time.monotonic() + 120
    while "listening" not in (tmp / "serve.err").read_text():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp / "serve.err").read_text()[-2000:])
        time.sleep(0.1)
    return server, err


def one_run(sessions: int, duration_s: float, cheap: bool, tmp: Path, workers: int = 0,
            spread: bool = False) -> dict:
    """serve + load at `sessions`; both records joined frame by frame. `spread`: the client's
    sessions start evenly over one frame period (their frames complete at different phases)
    instead of all at once (every session's frame completes in the same millisecond)."""
    tmp.mkdir(parents=True)
    server_db, client_db, port = tmp / "server.duckdb", tmp / "client.duckdb", _free_port()
    if cheap:
        _seed_cheap_twin(server_db)
    env = {**os.environ, "METRONOME_LOG": "WARNING"}
    server, err = start_serve(tmp, server_db, port, sessions, workers)
    load0 = os.getloadavg()[0]
    cpu0 = _cpu_s()
    client = subprocess.run(
        [sys.executable, "-m", "cli.main", "load", "--url", f"ws://127.0.0.1:{port}/v1/realtime",
         "--sessions", str(sessions), "--duration", str(duration_s), "--db", str(client_db),
         "--json", *(["--load", "ramp", "--arrival-rate", f"{sessions / (FRAME_MS / 1e3):g}"]
                     if spread and sessions > 1 else [])],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=duration_s + 300)
    cpu1 = _cpu_s()
    server.send_signal(signal.SIGTERM)  # serve ends its run and prints its summary
    out, _ = server.communicate(timeout=120)
    cpu2 = _cpu_s()
    err.close()
    if client.returncode or server.returncode:
        raise RuntimeError(f"load rc {client.returncode}: {client.stderr[-1500:]}\nserve rc "
                           f"{server.returncode}: {(tmp / 'serve.err').read_text()[-1500:]}")
    return {"sessions": sessions, "cheap_twin": cheap, "workers": workers, "spread": spread,
            "load_1m_start": round(load0, 2), "load_1m_end": round(os.getloadavg()[0], 2),
            **_joined(json.loads(client.stdout), client_db, json.loads(out), server_db),
            "client_cpu_s": round(cpu1 - cpu0, 2), "server_cpu_s": round(cpu2 - cpu1, 2)}


def _joined(client: dict, client_db: Path, server: dict, server_db: Path) -> dict:
    with duckdb.connect(str(client_db), read_only=True) as con:
        mine = con.execute("SELECT * FROM frames WHERE run_id = ?", [client["run_id"]]).df()
        opens = con.execute("SELECT detail FROM events WHERE run_id = ? AND kind = 'open'",
                            [client["run_id"]]).fetchall()
    with duckdb.connect(str(server_db), read_only=True) as con:
        theirs = con.execute("SELECT * FROM frames WHERE run_id = ?", [server["run_id"]]).df()
    ids = {d["session_id"]: d["server_session"] for d in (json.loads(o[0]) for o in opens)}
    mine["server_session"] = mine.session_id.map(ids)
    both = mine.merge(theirs, how="left", left_on=["server_session", "frame_idx"],
                      right_on=["session_id", "frame_idx"], suffixes=("_c", "_s"))
    both = both[both.frame_idx >= WARM_UP_FRAMES]
    paired = both[both.latency_ms_c.notna() & both.latency_ms_s.notna()]
    over = (paired.latency_ms_c - paired.latency_ms_s).to_numpy()

    def pct(values, q):
        values = np.asarray(values, dtype=float)
        return round(float(np.percentile(values, q)), 2) if len(values) else None

    in_p50, in_p95 = pct(paired.latency_ms_s, 50), pct(paired.latency_ms_s, 95)
    gw_p50, gw_p95 = pct(paired.latency_ms_c, 50), pct(paired.latency_ms_c, 95)
    answered = both[both.latency_ms_c.notna()]
    server_rows = both[both.silent_s.notna()]
    return {
        "admitted": client["admitted"], "rejected": client["rejected"],
        "frames": len(both), "paired": len(paired),
        "in_process_p50_ms": in_p50, "in_process_p95_ms": in_p95,
        "gateway_p50_ms": gw_p50, "gateway_p95_ms": gw_p95,
        "overhead_p50_ms": pct(over, 50), "overhead_p95_ms": pct(over, 95),
        "ratio_p50": round(gw_p50 / in_p50, 3) if in_p50 else None,
        "ratio_p95": round(gw_p95 / in_p95, 3) if in_p95 else None,
        "server_silent": int(server_rows.silent_s.astype(bool).sum()),
        "server_late": int((~server_rows.on_time_s.astype(bool)).sum()),
        "client_missing": int(both.silent_cause_c.eq("missing").sum()),
        "client_silent": int(both.silent_c.astype(bool).sum()),
        "client_p95_ms": pct(answered.latency_ms_c, 95),
        "client_over_period": int((answered.latency_ms_c > FRAME_MS).sum()),
        "server_status": server["status"]}


def clean(run: dict) -> bool:
    return (run["admitted"] == run["sessions"] and run["server_silent"] == 0
            and run["server_late"] == 0 and run["client_missing"] == 0
            and run["client_p95_ms"] is not None and run["client_p95_ms"] <= FRAME_MS)


def _median(runs: list[dict], key: str):
    values = [r[key] for r in runs if r[key] is not None]
    return round(statistics.median(values), 3) if values else None


def _series(sessions: int, args, cheap: bool, tmp: Path, tag: str) -> list[dict]:
    runs = []
    for i in range(args.runs):
        run = one_run(sessions, args.duration_s, cheap, tmp / f"{tag}-{sessions}-{i}",
                      args.workers, args.spread)
        run["clean"] = clean(run)
        print(json.dumps({"part": tag, "run": i, **run}), flush=True)
        runs.append(run)
    return runs


def _row(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))
            and not isinstance(v, bool) and k != "sessions"]
    return {"sessions": runs[0]["sessions"], "runs": len(runs),
            "clean_runs": sum(r["clean"] for r in runs), **{k: _median(runs, k) for k in keys}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="*", default=[1, 8, 32],
                    help="session counts of part 1 (none: skip it)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--ramp", type=int, nargs="*", default=[32, 64, 128, 256, 512])
    ap.add_argument("--bisect", type=int, default=2, help="steps between clean and not")
    ap.add_argument("--workers", type=int, default=0, help="gateway worker processes (0: one)")
    ap.add_argument("--spread", action="store_true",
                    help="the client's sessions start evenly over one frame period (default: "
                         "all at once, so every frame of every session completes together)")
    args = ap.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines()
        if line.startswith("Model name")), platform.processor())
    result = {"machine": {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                          "load_avg_before": os.getloadavg()},
              "frame_ms": FRAME_MS, "duration_s": args.duration_s, "runs": args.runs,
              "workers": args.workers, "spread": args.spread}
    with tempfile.TemporaryDirectory(prefix="gw-overhead-") as tmp:
        result["overhead"] = [_row(_series(n, args, False, Path(tmp), "overhead"))
                              for n in args.sessions]
        # A count is clean when most of its runs are (the median run is clean).
        ramp, last_clean, first_dirty = [], None, None
        for n in args.ramp:
            row = _row(_series(n, args, True, Path(tmp), "ramp"))
            ramp.append(row)
            if row["clean_runs"] * 2 > row["runs"]:
                last_clean = n
            else:
                first_dirty = n
                break
        while last_clean is None and first_dirty and first_dirty > 1:  # even the first was not
            n = first_dirty // 2
            row = _row(_series(n, args, True, Path(tmp), "ramp"))
            ramp.append(row)
            if row["clean_runs"] * 2 > row["runs"]:
                last_clean = n
            else:
                first_dirty = n
        for _ in range(args.bisect if last_clean and first_dirty else 0):
            n = (last_clean + first_dirty) // 2
            if n in (last_clean, first_dirty):
                break
            row = _row(_series(n, args, True, Path(tmp), "ramp"))
            ramp.append(row)
            if row["clean_runs"] * 2 > row["runs"]:
                last_clean = n
            else:
                first_dirty = n
        result["ramp"] = sorted(ramp, key=lambda r: r["sessions"])
        result["largest_clean_sessions"] = last_clean
        result["first_unclean_sessions"] = first_dirty
    result["machine"]["load_avg_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
