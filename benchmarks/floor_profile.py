"""Where the frame path's time goes: py-spy samples of the frame_floor process while one driver
runs (raw, then each Metronome mode), split by thread.

py-spy samples every thread of this process at 200 Hz without stopping it (--nonblocking).
With `gil` (the default) only the thread holding the GIL is sampled, so a thread's share is
its share of the GIL while the driver ran, and `gil_busy` is the share of samples in which
some thread held it at all: what the engine's loop thread (metronome-vllm: vLLM's output
handler, the session consumers, the hand-over of each chunk) waits behind. Without it every
thread that is not idle is sampled. Leaf and inclusive functions per thread are listed
(benchmarks/gateway_profile.py's summary).

    called by: .venv/bin/python benchmarks/frame_floor.py --profile 4 [--modes full bare]
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from floor_drivers import metronome_frames, pct, raw_frames
from gateway_profile import _py_spy, summarise

RATE_HZ = 200


def _record(pid: int, seconds: float, out: Path, gil: bool, native: bool) -> subprocess.Popen:
    cmd = [_py_spy(), "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r",
           str(RATE_HZ), "-f", "raw", "-o", str(out), "--threads", "--nonblocking"]
    cmd += ["--gil"] if gil else []
    cmd += ["--native"] if native else []
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_phases(engine, base, store, sessions: int, modes, gil: bool = True,
                   native: bool = False) -> dict:
    """Per driver (raw, then each mode) at `sessions`: p50/p95 and the profile summary."""
    import os

    result: dict = {"sessions": sessions, "gil_only": gil, "rate_hz": RATE_HZ, "drivers": {}}
    seconds = max(1.0, base.duration_s - 1.5)  # inside the run: after its start, before its end
    with tempfile.TemporaryDirectory() as tmp:
        for driver in ["raw", *modes]:
            out = Path(tmp) / f"{driver}.raw"
            spy = _record(os.getpid(), seconds, out, gil, native)
            time.sleep(0.3)  # py-spy attaches
            if driver == "raw":
                ms = raw_frames(engine, sessions, base.frame_ms, base.duration_s,
                                base.tokens_in, base.tokens_out)
            else:
                ms, _, _ = metronome_frames(engine, replace(base, sessions=sessions), store,
                                         driver)
            spy.wait(timeout=60)
            summary = summarise(out) if out.exists() else {"samples": 0}
            summary["gil_busy" if gil else "active"] = round(
                summary["samples"] / (RATE_HZ * int(seconds)), 3)
            result["drivers"][driver] = {"p50_ms": round(pct(ms, 0.5), 2),
                                         "p95_ms": round(pct(ms, 0.95), 2), **summary}
    return result
