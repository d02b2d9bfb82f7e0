"""The load client against vLLM's own /v1/realtime, then against Metronome's gateway (issue 37).

    .venv/bin/python benchmarks/vllm_realtime.py [--sessions 4] [--frame-ms 160]
        [--duration 20] [--db client.duckdb]

1. vLLM's realtime server with the bundled `asr-tiny` (engine/vllm_server.py) and
   `metronome load --protocol vllm` against it: N paced sessions of synthetic speech.
2. `metronome serve --engine vllm` (windowed, W=128, a fixed cap of N) and the same load (same
   seed: the same audio per session, at the same 16 kHz) with `--protocol openai`.
Both runs go into one client DuckDB, side by side (the console's Runs page compares them).
One server at a time: each is stopped before the next starts. The client connects through a
tap (benchmarks/ws_tap.py: a loopback relay that logs every message), so the runs' URLs are
the tap's.

Checks, per run. The client's record against itself: the summary's frame count equals the
frames table's rows; its silent count equals the frames to which no delta was mapped
(frames.tokens_out = 0: deltas per frame as the client logged them); every delta received is
on a frame or counted unmapped with why (server_events[delta] = Σ tokens_out + stray_deltas,
where each delta is one token: vLLM's; Metronome's carry their frame's token count and are
checked against the gateway's own record instead).
The record against the tap, a witness that is neither client nor server: the frames sent
(appends that crossed the wire) equal the summary's frames, and the tap's silent frames (its
own mapping of the deltas the server sent, by the client's rule) are the client's, frame by
frame. For the gateway run, the server's own record is joined frame by frame too (silent and
tokens per frame), as in benchmarks/gateway_vllm.py. The tap's log is kept beside the client
DuckDB (CLIENT.vllm.tap.jsonl, CLIENT.openai.tap.jsonl). `frames_scheduled` (N × ⌊duration /
period⌋) is what sessions open from the first instant would send; one that opened later sends
fewer.

Prints one JSON line per figure ({"run", "figure", "value"}), then a summary table. Exit status
1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gateway_vllm import _free_port, _frames, _opens  # noqa: E402
from benchmarks.report import machine  # noqa: E402
from benchmarks.ws_tap import Tap, frames_by_tap, segment_delays_ms  # noqa: E402
from engine.dtype import step_flags  # noqa: E402

START_TIMEOUT_S = 300
SEGMENT_S = 5.0  # vLLM's Qwen3-ASR realtime buffers this much audio per prompt
DELTA = {"vllm": "transcription.delta", "openai": "response.output_text.delta"}


def emit(run: str, figure: str, value) -> None:
    print(json.dumps({"run": run, "figure": figure, "value": value}), flush=True)


def _stop(proc: subprocess.Popen, timeout_s: float = 120) -> str:
    """SIGTERM to the server's process group (vLLM's engine process included); its stdout."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return out or ""


def _wait(proc: subprocess.Popen, log: Path, ready) -> float:
    start = time.monotonic()
    while not ready():
        if proc.poll() is not None or time.monotonic() - start > START_TIMEOUT_S:
            raise SystemExit("server did not start:\n" + log.read_text()[-3000:])
        time.sleep(0.5)
    return time.monotonic() - start


def _healthy(port: int):
    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return True
        except OSError:
            return False
    return ready


def _load(args, url: str, protocol: str, extra: list[str], env: dict) -> dict:
    load = subprocess.run(
        [sys.executable, "-m", "cli.main", "load", "--url", url, "--protocol", protocol,
         "--sessions", str(args.sessions), "--duration", str(args.duration), "--frame-ms",
         str(args.frame_ms), "--seed", str(args.seed), "--db", args.db, "--json", *extra],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=args.duration + 180)
    if load.returncode != 0:
        raise SystemExit(f"load ({protocol}) failed:\n" + load.stderr[-3000:])
    return json.loads(load.stdout)


def client_checks(db: str, summary: dict, frames_scheduled: int, delta: str) -> dict:
    """What the client's own record must say about itself (see the module's docstring)."""
    with duckdb.connect(db, read_only=True) as con:
        rows, silent, tokens = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE tokens_out = 0), "
            "coalesce(sum(tokens_out), 0) FROM frames WHERE run_id = ?",
            [summary["run_id"]]).fetchone()
    received = summary["server_events"].get(delta, 0)
    # Each delta is one token unless the server says how many it carries (Metronome's
    # metronome.tokens: a frame's tokens merged into one delta); then the server's own record
    # checks the tokens (server_join), not this count.
    one_each = summary["frame_mapping"] != "server frame_idx"
    # Scheduled: what N sessions of the whole duration would send; a session that opened late
    # sends fewer (it stops at the load's end), so frames_ok compares the record with itself
    # here and with the tap's count of appends in main().
    return {"frames_scheduled": frames_scheduled, "frames_summary": summary["frames"],
            "frames_rows": rows, "frames_ok": summary["frames"] == rows,
            "silent_summary": summary["silent_frames"], "silent_rows": silent,
            "silent_ok": summary["silent_frames"] == silent,
            "deltas_received": received, "deltas_on_frames": int(tokens),
            "deltas_unmapped": summary["stray_deltas"],
            "deltas_ok": received == int(tokens) + summary["stray_deltas"] if one_each
            else None}


def answers(db: str, run_id: str, frame_ms: float) -> dict:
    """Where the answers fell: frames answered per session and the longest silent stretch."""
    with duckdb.connect(db, read_only=True) as con:
        df = con.execute("SELECT session_id, frame_idx, silent, latency_ms FROM frames "
                         "WHERE run_id = ? ORDER BY session_id, frame_idx", [run_id]).df()
    longest = 0
    for _, session in df.groupby("session_id"):
        run = best = 0
        for silent in session.silent:
            run = run + 1 if silent else 0
            best = max(best, run)
        longest = max(longest, best)
    answered = df[~df.silent]
    return {"answered_frames": int(len(answered)),
            "answered_latency_p50_ms": None if answered.empty
            else round(float(answered.latency_ms.quantile(0.5)), 1),
            "answered_latency_p95_ms": None if answered.empty
            else round(float(answered.latency_ms.quantile(0.95)), 1),
            "longest_silence_s": round(longest * frame_ms / 1e3, 2)}


def _load_through_tap(args, port: int, protocol: str, extra: list[str],
                      env: dict) -> tuple[dict, dict]:
    """The load through a tap (benchmarks/ws_tap.py); the client's summary and the tap's
    frames."""
    tap = Tap(f"ws://127.0.0.1:{port}")
    try:
        summary = _load(args, f"ws://127.0.0.1:{tap.port}/v1/realtime", protocol, extra, env)
    finally:
        tap.close()
    tap.save(Path(args.db).with_suffix(f".{protocol}.tap.jsonl"))
    delays = segment_delays_ms(tap.notes, args.frame_ms, SEGMENT_S) if protocol == "vllm" \
        else []
    return summary, {"frames": frames_by_tap(tap.notes, summary["budget_ms"]),
                     "segment_delays_ms": delays}


def vllm_run(args, env: dict, tmp: Path) -> tuple[dict, dict]:
    port = _free_port()
    log = tmp / "vllm.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "cli.vllm_server", "asr-tiny",
                                   "--port", str(port)], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                  text=True)
    try:
        emit("vllm", "server_start_s", round(_wait(server, log, _healthy(port)), 1))
        return _load_through_tap(args, port, "vllm", ["--model", "asr-tiny"], env)
    finally:
        _stop(server)


def gateway_run(args, env: dict, tmp: Path) -> tuple[dict, dict, dict, str]:
    port, server_db = _free_port(), str(tmp / "server.duckdb")
    log = tmp / "serve.log"
    err = open(log, "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--engine", "vllm", "--port", str(port),
         "--db", server_db, "--duration", str(args.duration + 180), "--policy", "window",
         "--window", "128", "--pool-blocks", "128", "--frame-ms", str(args.frame_ms),
         "--admission", "fixed", "--sessions", str(args.sessions), "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=err, env=env, text=True,
        start_new_session=True)
    try:
        emit("gateway", "server_start_s",
             round(_wait(server, log, lambda: "listening" in log.read_text()), 1))
        client, tapped = _load_through_tap(args, port, "openai", [], env)
    finally:
        out = _stop(server)
        err.close()
    return client, tapped, json.loads(out), server_db


def tap_join(db: str, summary: dict, tapped: dict) -> dict:
    """The client's frames beside the tap's: frames sent and silent, and the frames where they
    disagree (a frame one saw and the other did not counts too)."""
    mine = _frames(db, summary["run_id"])
    mine["server_session"] = mine.session_id.map(_opens(db, summary["run_id"]))
    client = {(s, int(k)): int(t) for s, k, t in
              zip(mine.server_session, mine.frame_idx, mine.tokens_out)}
    delays = tapped["segment_delays_ms"]
    tapped = tapped["frames"]
    tap = {key: n for key, n in tapped.items() if key[1] is not None}
    keys = set(client) | set(tap)
    return {"tap_frames_sent": len(tap), "tap_silent": sum(n == 0 for n in tap.values()),
            "tap_deltas_unmapped": sum(n for key, n in tapped.items() if key[1] is None),
            "tap_frames_missing_in_client": len(set(tap) - set(client)),
            "tap_silent_disagree": sum((client.get(k, 0) == 0) != (tap.get(k, 0) == 0)
                                       for k in keys),
            # Not a check: a delta that reaches the tap just before an append and the client
            # just after it (or the reverse) is on neighbouring frames in the two logs; under
            # load the client's loop lags by milliseconds. Silence is not moved by it.
            "tap_tokens_disagree": sum(client.get(k, 0) != tap.get(k, 0) for k in keys),
            # A segment's audio complete → its first delta (vLLM only: the tap sees it whole).
            "tap_segments_answered": len(delays),
            "tap_segment_first_delta_p50_ms": round(float(np.median(delays)), 1)
            if delays else None,
            "tap_segment_first_delta_max_ms": round(max(delays), 1) if delays else None}


def server_join(db: str, client: dict, server: dict, server_db: str) -> dict:
    mine, theirs = _frames(db, client["run_id"]), _frames(server_db, server["run_id"])
    mine["server_session"] = mine.session_id.map(_opens(db, client["run_id"]))
    both = mine.merge(theirs, left_on=["server_session", "frame_idx"],
                      right_on=["session_id", "frame_idx"], suffixes=("_client", "_server"))
    return {"server_frames": len(theirs), "server_silent": int(theirs.silent.sum()),
            "server_stalled": server.get("stalled"), "joined_frames": len(both),
            "silent_disagree": int((both.silent_client != both.silent_server).sum()),
            "tokens_disagree": int((both.tokens_out_client != both.tokens_out_server).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--frame-ms", type=float, default=160.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", default=None, help="the client DuckDB (default: a temp dir)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-realtime-"))
    args.db = args.db or str(tmp / "client.duckdb")
    env = {**os.environ, "METRONOME_LOG": "WARNING", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    scheduled = args.sessions * math.floor(args.duration * 1e3 / args.frame_ms + 1e-9)
    emit("both", "client_db", args.db)
    emit("both", "machine", f"{machine()}; flags {' '.join(step_flags()) or 'none'}")
    emit("both", "settings", {"sessions": args.sessions, "frame_ms": args.frame_ms,
                              "duration_s": args.duration, "seed": args.seed,
                              "frames_scheduled": scheduled})
    emit("both", "load_average_1m_before", os.getloadavg()[0])

    results, failed = {}, False
    vllm, vllm_tapped = vllm_run(args, env, tmp)
    client, client_tapped, server, server_db = gateway_run(args, env, tmp)
    for name, summary, tapped in (("vllm", vllm, vllm_tapped), ("gateway", client, client_tapped)):
        figures = {"run_id": summary["run_id"], "url": summary["url"],
                   "protocol": summary["protocol"], "frame_mapping": summary["frame_mapping"],
                   "admitted": summary["admitted"],
                   **client_checks(args.db, summary, scheduled,
                                   DELTA[summary["protocol"]] if summary["protocol"] in DELTA
                                   else "?"),
                   **tap_join(args.db, summary, tapped),
                   "silent_share": round(summary["silent_frames"] / max(1, summary["frames"]),
                                         4),
                   "on_time_rate": summary["on_time_rate"],
                   "first_delta_p50_ms": summary["first_delta_p50_ms"],
                   "first_delta_p95_ms": summary["first_delta_p95_ms"],
                   **answers(args.db, summary["run_id"], args.frame_ms),
                   "deltas_unmapped_by_why": summary["deltas_unmapped"],
                   "errors": summary["errors"]}
        if name == "gateway":
            figures.update(server_join(args.db, client, server, server_db))
        for figure, value in figures.items():
            emit(name, figure, value)
        results[name] = figures
        failed |= not (figures["frames_ok"] and figures["silent_ok"]) \
            or figures["deltas_ok"] is False
        failed |= figures["tap_frames_sent"] != figures["frames_summary"] or \
            figures["tap_silent"] != figures["silent_summary"] or \
            figures["tap_silent_disagree"] != 0
    failed |= results["gateway"]["silent_disagree"] != 0 or \
        results["gateway"]["tokens_disagree"] != 0
    emit("both", "load_average_1m_after", os.getloadavg()[0])
    keys = [k for k in results["vllm"] if not isinstance(results["vllm"][k], (dict, list))]
    print(f"\n{'figure':<26} {'vLLM /v1/realtime':>28} {'Metronome gateway':>28}")
    for key in keys:
        print(f"{key:<26} {str(results['vllm'].get(key)):>28} "
              f"{str(results['gateway'].get(key)):>28}")
    print(f"\nchecks {'FAILED' if failed else 'passed'}; client DuckDB: {args.db}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
