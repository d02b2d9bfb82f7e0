"""Does Prometheus scraping perturb the tick? The same paced twin run three ways, side by side.

    .venv/bin/python benchmarks/metrics_overhead.py [--rounds 3] [--duration-s 20]

Each round runs three identical paced-twin runs in this process (32 sessions with staggered
frames, 80 ms frames, W=128, pool 4096 blocks: every frame on time with the default twin cost,
so 400 frame rows a second reach the observer; the twin keeps virtual time exact and records
how far the run thread lags the wall clock as the tick's overrun):
- none:    no metrics observer at all;
- exported: the MetricsExporter observes every row and serves /metrics, nobody scrapes;
- scraped: the same, scraped every second by a real Prometheus (Debian's package) that loads
           deploy/prometheus/alerts.yml and evaluates it every second too.
The order rotates between rounds so drift on a shared machine hits all three. Ticks of the
first 2 s (sessions opening) are left out. Two figures per tick: the runner's overrun_ms (what
the console and the soak report) and the tick's pure wall-clock lag (see _WallLag). Also times one scrape's text
(generate_latest on the default registry) in this process, which is the GIL time a scrape
takes from the run. Prints every figure as one JSON object; results go to docs/BENCHMARKS.md
by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SESSIONS, FRAME_MS, WARM_UP_S = 32, 80.0, 2.0
MODES = ("none", "exported", "scraped")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Prometheus:
    """A real Prometheus scraping 127.0.0.1:target every second, rules evaluated every second."""

    def __init__(self, tmp: Path, target: int) -> None:
        tmp.mkdir()
        shutil.copy(ROOT / "deploy" / "prometheus" / "alerts.yml", tmp / "alerts.yml")
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "rule_files: [alerts.yml]\n"
            "scrape_configs:\n  - job_name: metronome\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n")
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        deadline = time.monotonic() + 30
        while not self.query('up{job="metronome"} == 1'):  # scraping before the run starts
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start scraping")
            time.sleep(0.2)

    def query(self, expr: str) -> list:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?query="
                                        + urllib.request.quote(expr), timeout=5) as r:
                return json.load(r)["data"]["result"]
        except OSError:
            return []

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class _WallLag:
    """Measurement, in every mode: how late each tick's row is written against the tick's due
    time on the wall clock (wake-up latency + the tick's own work). The runner's overrun_ms is
    the larger of the twin's virtual overshoot (a step ending past the tick: a few ms, the same
    in every mode) and the lag it had before sleeping, so small wall lags hide under it and a
    late wake-up is not in it at all. Reads the paced twin's wall origin and the run's virtual
    start (private attributes; this is a benchmark probe, not an API)."""

    def __init__(self, engine) -> None:
        self.engine, self.runner, self.lags_ms = engine, None, []

    def observe(self, table: str, row: dict) -> None:
        if table == "ticks" and row["t"] > WARM_UP_S:
            due_wall_s = self.runner._t0 + row["t"]  # virtual = wall − wall0 when paced
            now_wall_s = time.perf_counter() - self.engine._wall0
            self.lags_ms.append(max(0.0, now_wall_s - due_wall_s) * 1e3)


def _quantiles(values: list[float]) -> dict:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50_ms": round(statistics.median(values), 3), "p95_ms": round(cuts[94], 3),
            "p99_ms": round(cuts[98], 3), "max_ms": round(max(values), 3)}


def _run(mode: str, store, exporter, port: int, duration_s: float, tmp: Path) -> dict:
    from runtime import RunConfig, Runner, make_engine

    config = RunConfig(engine="twin", paced=True, policy="window", window=128,
                       pool_blocks=4096, sessions=SESSIONS, frame_ms=FRAME_MS,
                       duration_s=duration_s, stagger=True)
    prom = _Prometheus(tmp / f"prom-{time.monotonic_ns()}", port) if mode == "scraped" \
        else None
    engine = make_engine(config)
    wall = _WallLag(engine)
    observers = [wall] if mode == "none" else [exporter, wall]
    runner = Runner(config, engine, store, observers=observers)
    wall.runner = runner
    if mode != "none":
        exporter.run_started_for(runner.run_id, config)
    cpu0 = time.process_time()
    try:
        summary = runner.run()
    finally:
        engine.shutdown()
    cpu_s = time.process_time() - cpu0
    scrapes = {}
    if prom is not None:
        window = f"{int(duration_s)}s"
        scrapes = {
            "scrapes": _scalar(prom.query(f'count_over_time(up{{job="metronome"}}[{window}])')),
            "scrape_ms_avg": _scalar(prom.query(
                f'1e3 * avg_over_time(scrape_duration_seconds{{job="metronome"}}[{window}])')),
            "samples_per_scrape": _scalar(prom.query('scrape_samples_scraped{job="metronome"}')),
        }
        prom.close()
    if mode != "none":
        exporter.run_ended(runner.run_id, summary)
    store.writer.flush()
    q, worst, late, ticks = store.cursor().execute(
        """SELECT quantile_cont(overrun_ms, [0.5, 0.95, 0.99]), max(overrun_ms),
                  avg(CASE WHEN overrun_ms > ? THEN 1.0 ELSE 0.0 END), count(*)
           FROM ticks WHERE run_id = ? AND t > ?""",
        [FRAME_MS / 2, runner.run_id, WARM_UP_S]).fetchone()
    return {"mode": mode, "run_id": runner.run_id, "ticks": ticks,
            "overrun": {"p50_ms": round(q[0], 3), "p95_ms": round(q[1], 3),
                        "p99_ms": round(q[2], 3), "max_ms": round(worst, 2),
                        "late_share": round(late, 4)},
            "wall_lag": _quantiles(wall.lags_ms),
            "silent_frames": summary["silent_frames"], "process_cpu_s": round(cpu_s, 2),
            **scrapes}


def _scalar(result: list):
    return round(float(result[0]["value"][1]), 3) if result else None


def _scrape_text_ms(repeats: int = 200) -> dict:
    """One scrape's text in this process (the part that holds the GIL), idle exporter."""
    from prometheus_client import REGISTRY, generate_latest

    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        text = generate_latest(REGISTRY)
        times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": round(statistics.median(times), 3),
            "max_ms": round(max(times), 3), "bytes": len(text)}


def main() -> None:
    from metrics import default_exporter, serve
    from store import Store

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=20.0)
    args = parser.parse_args()
    if shutil.which("prometheus") is None:
        sys.exit("Debian's prometheus is not installed (bash scripts/setup.sh test)")
    exporter = default_exporter()
    port = serve(_free_port())
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "bench.duckdb"))
        exporter.track_store(store.writer)
        try:
            for i in range(args.rounds):
                order = MODES[i % 3:] + MODES[:i % 3]
                for mode in order:
                    runs.append(_run(mode, store, exporter, port, args.duration_s, Path(tmp)))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            text_cost = _scrape_text_ms()
        finally:
            store.close()
    def median(mode, part, key):
        return round(statistics.median(r[part][key] for r in runs if r["mode"] == mode), 3)

    medians = {m: {"overrun": {k: median(m, "overrun", k) for k in runs[0]["overrun"]},
                   "wall_lag": {k: median(m, "wall_lag", k) for k in runs[0]["wall_lag"]},
                   "process_cpu_s": round(statistics.median(
                       r["process_cpu_s"] for r in runs if r["mode"] == m), 2)}
               for m in MODES}
    print(json.dumps({"load_avg_at_end": os.getloadavg(), "sessions": SESSIONS,
                      "frame_ms": FRAME_MS, "duration_s": args.duration_s,
                      "rounds": args.rounds, "median_over_runs": medians,
                      "scrape_text_in_process": text_cost, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
