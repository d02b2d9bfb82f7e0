"""Where a live W/S change spends its time, in every process: py-spy samples the front end,
the engine core and the worker during benchmarks/live_change_cost.py, and this counts the
samples in the functions a change runs.

    pip install py-spy   # a profiler, not a project dependency
    .venv/bin/python benchmarks/profile_live_change.py --py-spy $(which py-spy)

Samples at --rate Hz: a function's samples / rate ≈ its seconds of CPU or waiting.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a change runs: the front end's request and poll, the engine core's utility call and
# its two worker round trips, and what a worker does per step once rows carry old settings.
KEYS = ("begin_policy_change", "_set_sinks", "apply_pending", "set_sinks_in_engine_core",
        "check_in_worker", "apply_in_worker", "name_batch_rows", "row_carry")


def role(command: str) -> str:
    if "live_change_cost" in command:
        return "front end (run thread, vLLM client)"
    return "engine process"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", default="py-spy")
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--duration", type=float, default=12.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "profile.raw")
        done = subprocess.run(
            [args.py_spy, "record", "--subprocesses", "--rate", str(args.rate), "--format",
             "raw", "-o", raw, "--", sys.executable,
             os.path.join(ROOT, "benchmarks", "live_change_cost.py"), "--duration",
             str(args.duration)], capture_output=True, text=True, cwd=ROOT)
        print(done.stdout)
        per_process, hits = collections.Counter(), collections.Counter()
        for line in open(raw):
            stack, _, n = line.rstrip().rpartition(" ")
            procs = re.findall(r'process (\d+):"([^"]*)"', stack)
            if not procs:
                continue
            pid, command = procs[-1]
            who = f"{pid} {role(command)}"
            per_process[who] += int(n)
            for key in KEYS:
                if key in stack:
                    hits[(who, key)] += int(n)
    print(f"samples per process at {args.rate} Hz:")
    for who, n in per_process.most_common():
        print(f"  {who}: {n}")
    print("samples in the change's functions:")
    for (who, key), n in sorted(hits.items(), key=lambda kv: -kv[1]):
        print(f"  {key} ({who}): {n} samples ≈ {n / args.rate * 1e3:.0f} ms")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
