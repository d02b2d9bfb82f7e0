"""Does the console slow the tick? The same run with the Live page open in a browser and closed.

    .venv/bin/python benchmarks/ui_tick_overrun.py [--rounds 3] [--duration-s 60]

One `streamlit run` server; each round starts two identical paced-twin runs from its Load page
(64 sessions, 80 ms frames, W=128: the twin keeps virtual time exact and records how far the
run thread lags the wall clock as the tick's overrun), one while a headless Debian Chromium
watches the Live page (1 Hz fragment: queries, charts, redraws), one with the browser on
about:blank. Order alternates between rounds so drift on a shared machine hits both. After the
rounds the server stops and the ticks are read from its DuckDB file. Prints one JSON object;
results go to docs/BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SESSIONS, FRAME_MS = 64, 80


def _serve(db: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "streamlit_app.py"),
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env={**os.environ, "METRONOME_DB": db},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("streamlit did not start")
        time.sleep(0.2)


def _cpu_s(server: subprocess.Popen) -> dict:
    """CPU seconds so far of the console's server process and of every Chromium process."""
    import psutil

    def total(p) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    browser = [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name()]
    return {"server": total(psutil.Process(server.pid)),
            "browser": sum(total(p) for p in browser)}


def _start_run(page, url: str, duration_s: float) -> None:
    from playwright.sync_api import expect

    def select(label: str, option: str) -> None:
        page.locator('[data-testid="stSelectbox"]').filter(has_text=label).first.click()
        page.get_by_role("option", name=option, exact=True).click()

    page.goto(f"{url}/load")
    select("Engine", "twin (simulated)")
    page.get_by_text("Paced (twin in real time)").click()
    select("KV policy", "window")
    page.get_by_role("spinbutton", name="W: window tokens", exact=True).fill("128")
    page.get_by_role("spinbutton", name="Sessions N", exact=True).fill(str(SESSIONS))
    page.get_by_role("spinbutton", name="Frame period (ms)", exact=True).fill(str(FRAME_MS))
    page.get_by_role("spinbutton", name="Pool blocks", exact=True).fill("4096")
    page.get_by_role("spinbutton", name="Duration (s)", exact=True).fill(str(int(duration_s)))
    page.get_by_role("button", name="Start").click()
    expect(page.get_by_text("started: follow it on the Live page")).to_be_visible(timeout=15_000)


def _overruns(db: str) -> list[dict]:
    from store import open_store

    cur = open_store(db).cursor()
    rows = cur.execute(
        """
        SELECT r.run_id, r.started_at,
               quantile_cont(t.overrun_ms, [0.5, 0.95, 0.99]) AS q, max(t.overrun_ms) AS worst,
               avg(CASE WHEN t.overrun_ms > ? THEN 1.0 ELSE 0.0 END) AS late_share,
               count(*) AS ticks
        FROM runs r JOIN ticks t USING (run_id)
        WHERE t.t > 2.0  -- past start-up (the page's first render, sessions opening)
        GROUP BY 1, 2 ORDER BY 2
        """, [FRAME_MS / 2]).fetchall()
    return [{"run_id": r[0], "p50_ms": round(r[2][0], 2), "p95_ms": round(r[2][1], 2),
             "p99_ms": round(r[2][2], 2), "max_ms": round(r[3], 1),
             "late_share": round(r[4], 4), "ticks": r[5]} for r in rows]


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=60.0)
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"Debian chromium is not installed at {CHROMIUM} (scripts/setup.sh test)")
    order, cpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "ui.duckdb")
        proc, url = _serve(db)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1800})
                for i in range(args.rounds):
                    for mode in (("open", "closed") if i % 2 == 0 else ("closed", "open")):
                        _start_run(page, url, args.duration_s)
                        page.goto(url if mode == "open" else "about:blank")
                        before = _cpu_s(proc)
                        time.sleep(args.duration_s + 3)
                        after = _cpu_s(proc)
                        order.append(mode)
                        cpu.append({k: round(after[k] - before[k], 1) for k in after})
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
        runs = _overruns(db)
    assert len(runs) == len(order), (len(runs), order)
    by_mode = {m: [r for r, o in zip(runs, order) if o == m] for m in ("open", "closed")}
    summary = {m: {k: statistics.median(r[k] for r in rs)
                   for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "late_share")}
               for m, rs in by_mode.items()}
    print(json.dumps({"load_avg_at_end": os.getloadavg(), "sessions": SESSIONS,
                      "frame_ms": FRAME_MS, "duration_s": args.duration_s,
                      "rounds": args.rounds, "median_over_runs": summary,
                      "runs": [{**r, "page": o, "cpu_s": c}
                               for r, o, c in zip(runs, order, cpu)]}, indent=2))


if __name__ == "__main__":
    main()
