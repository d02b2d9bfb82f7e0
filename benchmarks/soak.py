"""Soak: one long run with process memory, DuckDB size and tick overruns sampled.

    .venv/bin/python benchmarks/soak.py --engine twin --minutes 30     # paced twin
    .venv/bin/python benchmarks/soak.py --engine vllm --minutes 10     # real vLLM, tiny model
    make soak                                                          # both, into the doc

Window policy with a small max_model_len, so sessions roll over many times. Memory counts this
process and its children (vLLM's engine core and worker). "Flat" compares the mean RSS of the
second half with the first half after warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import psutil  # noqa: E402


def rss_mb() -> float:
    me = psutil.Process()
    procs = [me] + me.children(recursive=True)
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def db_mb(path: str) -> float:
    """The database's size on disk, its write-ahead log included."""
    return sum(os.path.getsize(p) for p in (path, path + ".wal") if os.path.exists(p)) / 2**20


def soak(engine: str, seconds: float, sample_s: float = 5.0, db: str | None = None) -> dict:
    from runtime import RunConfig, Runner, make_engine
    from store import Store

    cfg = RunConfig(engine=engine, model="tiny", policy="window", window=128, pool_blocks=256,
                    max_model_len=1024, sessions=8, frame_ms=80.0, duration_s=seconds,
                    paced=engine == "twin", stall_guard=True)
    db = db or os.path.join(tempfile.mkdtemp(), "soak.duckdb")
    store = Store(db)
    eng = make_engine(cfg)
    runner = Runner(cfg, eng, store)
    thread = threading.Thread(target=runner.run, daemon=True)
    samples = []
    t0 = time.perf_counter()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(timeout=sample_s)
            samples.append((time.perf_counter() - t0, rss_mb(), db_mb(db)))
    finally:
        eng.shutdown()
        store.close()
    s = runner.summary
    warm = [m for t, m, _ in samples if t > min(60.0, seconds / 4)]
    half = len(warm) // 2
    growth = (statistics.fmean(warm[half:]) - statistics.fmean(warm[:half])) if half else 0.0
    return {"engine": engine, "seconds": seconds, "status": s.status, "frames": s.frames,
            "silent_rate": s.silent_rate, "stalled": s.stalled, "rollovers": s.rollovers,
            "tick_overruns": s.tick_overruns, "max_overrun_ms": s.max_overrun_ms,
            "rss_start_mb": round(warm[0], 1) if warm else None,
            "rss_end_mb": round(warm[-1], 1) if warm else None,
            "rss_growth_mb": round(growth, 1), "db_mb": round(samples[-1][2], 1),
            "samples": len(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["twin", "vllm"], default="twin")
    parser.add_argument("--minutes", type=float, default=30.0)
    args = parser.parse_args()
    from benchmarks.report import machine, write_section

    r = soak(args.engine, args.minutes * 60)
    print(r, flush=True)
    title = f"Soak: {args.engine}, {args.minutes:g} minutes"
    write_section(title, f"""
Command: `.venv/bin/python benchmarks/soak.py --engine {args.engine} --minutes {args.minutes:g}`
Machine: {machine()}, load average at the end {os.getloadavg()[0]:.1f} (other jobs share
these 2 cores unless that is near 1). One run: 8 sessions, 80 ms frames, window W=128, max_model_len 1024 (forced
rollovers), stall guard on{', twin paced in wall-clock time' if args.engine == 'twin' else ', tiny model'}.

| status | frames | silent rate | stalled | rollovers | tick overruns | max overrun | RSS after warm-up → end | RSS growth (2nd half − 1st half) | DuckDB size |
|---|---|---|---|---|---|---|---|---|---|
| {r['status']} | {r['frames']} | {r['silent_rate']} | {r['stalled']} | {r['rollovers']} | {r['tick_overruns']} | {r['max_overrun_ms']} ms | {r['rss_start_mb']} → {r['rss_end_mb']} MB | {r['rss_growth_mb']} MB | {r['db_mb']} MB |
""")


if __name__ == "__main__":
    main()
