"""The gateway in front of vLLM: client and server records of the same frames (issue 27).

    .venv/bin/python benchmarks/gateway_vllm.py [--sessions 4] [--frame-ms 160] [--duration 10]

`metronome serve --engine vllm` (windowed, W=128, a fixed cap) in one process, `metronome load`
(synthetic speech) against it in another, on loopback. Prints one JSON object: the server's
stall flag and silent frames, the client's silent frames, and the silent frames of the frames
both recorded (joined by the client's `open` events), which must be equal frame by frame.
Not in the test suite: the server's own engine start would cost the suite ~30 s; run it on a
machine where `--sessions` is at most half of N_c at `--frame-ms` (`metronome calibrate`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _frames(db: str, run_id: str):
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT session_id, frame_idx, silent, tokens_out FROM frames "
                           "WHERE run_id = ?", [run_id]).df()


def _opens(db: str, run_id: str) -> dict:
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT detail FROM events WHERE run_id = ? AND kind = 'open'",
                           [run_id]).fetchall()
    details = [json.loads(r[0]) for r in rows]
    return {d["session_id"]: d["server_session"] for d in details if "server_session" in d}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--frame-ms", type=float, default=160.0)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    port, server_db, client_db = _free_port(), str(tmp / "server.duckdb"), str(tmp / "client.duckdb")
    env = {**os.environ, "METRONOME_LOG": "WARNING", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    err = open(tmp / "serve.err", "w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--engine", "vllm", "--port", str(port),
         "--db", server_db, "--duration", str(args.duration + 120), "--policy", "window",
         "--window", "128", "--pool-blocks", "128", "--frame-ms", str(args.frame_ms),
         "--admission", "fixed", "--sessions", str(args.sessions), "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while "listening" not in Path(err.name).read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("serve did not start:\n" + Path(err.name).read_text()[-2000:])
            time.sleep(0.5)
        load = subprocess.run(
            [sys.executable, "-m", "cli.main", "load", "--url",
             f"ws://127.0.0.1:{port}/v1/realtime", "--db", client_db, "--json", "--sessions",
             str(args.sessions), "--duration", str(args.duration), "--frame-ms",
             str(args.frame_ms)], cwd=ROOT, capture_output=True, text=True, env=env,
            timeout=args.duration + 120)
        if load.returncode != 0:
            raise SystemExit("load failed:\n" + load.stderr[-2000:])
        client = json.loads(load.stdout)
    finally:
        server.send_signal(signal.SIGTERM)  # serve ends its run and prints its summary
        out, _ = server.communicate(timeout=120)
        err.close()
    summary = json.loads(out)
    mine, theirs = _frames(client_db, client["run_id"]), _frames(server_db, summary["run_id"])
    mine["server_session"] = mine.session_id.map(_opens(client_db, client["run_id"]))
    both = mine.merge(theirs, left_on=["server_session", "frame_idx"],
                      right_on=["session_id", "frame_idx"], suffixes=("_client", "_server"))
    print(json.dumps({
        "sessions": args.sessions, "frame_ms": args.frame_ms, "duration_s": args.duration,
        "server": {"stalled": summary.get("stalled"), "frames": len(theirs),
                   "silent": int(theirs.silent.sum()), "dtype": summary.get("dtype")},
        "client": {"admitted": client.get("admitted"), "frames": len(mine),
                   "silent": int(mine.silent.sum())},
        "joined": {"frames": len(both), "client_missing_on_server": len(mine) - len(both),
                   "silent_client": int(both.silent_client.sum()),
                   "silent_server": int(both.silent_server.sum()),
                   "silent_disagree": int((both.silent_client != both.silent_server).sum()),
                   "tokens_disagree": int((both.tokens_out_client
                                           != both.tokens_out_server).sum())},
    }, indent=1))


if __name__ == "__main__":
    main()
