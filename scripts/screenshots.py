"""Screenshots of recorded runs as an operator sees them: the console in Debian's Chromium
(Playwright, no browser download), the Live page with each run picked, a tall viewport.

    .venv/bin/python scripts/screenshots.py --db runs.duckdb --out artifacts/shots RUN_ID...

Also used by the browser tests (tests/e2e), which save their pictures under artifacts/.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1400, "height": 2600}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def console(db: str, env: dict | None = None):
    """A headless console on a free local port for database `db`; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "streamlit_app.py"),
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env={**os.environ, "METRONOME_DB": db, **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()[-2000:])
            if time.monotonic() > deadline:
                raise RuntimeError("streamlit did not start within 30 s")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def show_run(page, url: str, run_id: str) -> None:
    """Open the Live page and pick `run_id` in its run picker; wait for the charts."""
    from playwright.sync_api import expect

    page.goto(url)
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Run").first.click()
    page.get_by_role("option").filter(has_text=run_id).first.click()
    expect(page.get_by_text(f"Run {run_id}")).to_be_visible(timeout=20_000)
    expect(page.locator('[data-testid="stVegaLiteChart"]').nth(3)).to_be_visible(timeout=20_000)
    time.sleep(2.5)  # two refreshes of the fragment: the charts have drawn


def screenshot_runs(db: str, out: Path, run_ids: list[str]) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    with console(db) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        for run_id in run_ids:
            show_run(page, url, run_id)
            path = out / f"live-{run_id}.png"
            page.screenshot(path=str(path), full_page=True)
            paths.append(path)
        browser.close()
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "shots"))
    parser.add_argument("run_ids", nargs="+")
    args = parser.parse_args()
    for path in screenshot_runs(args.db, Path(args.out), args.run_ids):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
