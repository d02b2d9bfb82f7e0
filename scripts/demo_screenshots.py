"""The console's one-click demo on a chosen engine, as an operator sees it: an empty database,
the Live page's demo button, the comparison it lands on, then the Experiments form it leaves.

    .venv/bin/python scripts/demo_screenshots.py --engine vllm --out artifacts/demo-vllm

Debian Chromium through Playwright (no browser download). On vLLM the first click calibrates
(one to two minutes on two cores) and runs the pair (two engine starts): allow ~5 minutes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import ARGS, VIEWPORT, console  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("twin", "vllm"), default="vllm")
    parser.add_argument("--out", type=Path, default=Path("artifacts/demo"))
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args()
    from playwright.sync_api import expect, sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    db = str(Path(tempfile.mkdtemp()) / "demo.duckdb")
    timeout_ms = args.timeout_s * 1e3
    with console(db, env={"METRONOME_DEMO_ENGINE": args.engine}) as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url)
        button = page.get_by_role("button", name="Run the cliff vs slope demo")
        expect(button).to_be_visible(timeout=30_000)
        page.screenshot(path=str(args.out / "1-landing.png"))
        button.click()
        expect(page).to_have_url(f"{url}/experiments", timeout=60_000)
        story = page.get_by_text("Same ", exact=False).filter(has_text="went silent")
        expect(story.first).to_be_visible(timeout=timeout_ms)
        page.wait_for_timeout(3000)  # the charts draw on the next refreshes
        page.screenshot(path=str(args.out / "2-comparison.png"), full_page=True)
        page.goto(f"{url}/experiments")
        page.wait_for_timeout(4000)
        page.screenshot(path=str(args.out / "3-experiments-after.png"), full_page=True)
        browser.close()
    print("\n".join(str(p) for p in sorted(args.out.glob("*.png"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
