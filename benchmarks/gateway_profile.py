"""Where a gateway process's time goes: py-spy samples of `metronome serve` (and of the load
client beside it) while N paced sessions run, split by thread, with the functions that hold
the most samples.

    .venv/bin/python benchmarks/gateway_profile.py [--sessions 32] [--seconds 7] [--cheap]

The server is the twin (paced, window W=128, 80 ms frames, fixed admission at N); `--cheap`
seeds the near-free step cost model of benchmarks/gateway_overhead.py, so the engine is never
what limits. py-spy samples every thread at 200 Hz without stopping the process
(--nonblocking); idle threads are left out, so a thread's share is of the samples in which it
ran or waited for the GIL. Prints one JSON object: per process, the share of samples per
thread, and the top leaf and inclusive functions per thread (a leaf is where the sample was
taken: zlib in permessage-deflate, a DuckDB call, numpy's FFT in the stand-in tokenizer).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: `.venv/bin/pip install py-spy` "
                         "(it is in the test extras: bash scripts/setup.sh test)")
    return found


def _record(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    return subprocess.Popen([_py_spy(), "record", "-p", str(pid), "-d", str(int(seconds)),
                             "-r", "200", "-f", "raw", "-o", str(out), "--threads",
                             "--nonblocking"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _thread(name: str) -> str:
    # "thread (1234): metronome-run-2026…" → "metronome-run"; MainThread stays.
    label = name.split(": ", 1)[-1]
    return "metronome-run" if label.startswith("metronome-run") else label


def summarise(raw: Path, top: int = 8) -> dict:
    by_thread: collections.Counter = collections.Counter()
    leaf: dict = collections.defaultdict(collections.Counter)
    inclusive: dict = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        thread = _thread(frames[0])
        by_thread[thread] += int(n)
        leaf[thread][frames[-1].split(" (")[0] + " " + frames[-1].rsplit("/", 1)[-1]
                     .rstrip(")")] += int(n)
        for f in set(frames[1:]):
            inclusive[thread][f.split(" (")[0]] += int(n)
    total = sum(by_thread.values()) or 1
    return {"samples": total,
            "threads": {t: round(n / total, 3) for t, n in by_thread.most_common()},
            "leaf": {t: [[f, round(n / by_thread[t], 3)] for f, n in c.most_common(top)]
                     for t, c in leaf.items() if by_thread[t] / total > 0.05},
            "inclusive": {t: [[f, round(n / by_thread[t], 3)] for f, n in c.most_common(top * 3)
                              if not f.startswith(("Thread.", "_run_module", "_run_code",
                                                   "<module>", "run", "main"))][:top]
                          for t, c in inclusive.items() if by_thread[t] / total > 0.05}}


def main() -> None:
    from gateway_overhead import _free_port, _seed_cheap_twin, start_serve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=7.0)
    ap.add_argument("--cheap", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        db, port = tmp / "server.duckdb", _free_port()
        if args.cheap:
            _seed_cheap_twin(db)
        env = {**os.environ, "METRONOME_LOG": "WARNING"}
        server, _err = start_serve(tmp, db, port, args.sessions)
        client = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "load", "--url",
             f"ws://127.0.0.1:{port}/v1/realtime", "--sessions", str(args.sessions),
             "--duration", str(args.seconds + 6), "--no-store", "--json"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        time.sleep(3)  # the sessions are up and paced
        load_before = os.getloadavg()[0]
        spies = [_record(server.pid, args.seconds, tmp / "server.raw"),
                 _record(client.pid, args.seconds, tmp / "client.raw")]
        for spy in spies:
            spy.wait()
        client.communicate(timeout=120)
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=120)
        result = {"sessions": args.sessions, "cheap_twin": args.cheap,
                  "seconds": args.seconds, "load_avg_1m": round(load_before, 2),
                  "server": summarise(tmp / "server.raw"),
                  "client": summarise(tmp / "client.raw")}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
