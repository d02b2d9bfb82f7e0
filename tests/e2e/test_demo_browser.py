"""The one-click demo in a real browser (Debian Chromium through Playwright): an empty console
offers the demo on its Live page; one click calibrates, runs the pair and lands on the
comparison with its story. The console's demo engine is the TWIN here ($METRONOME_DEMO_ENGINE=
twin), so CI needs no vLLM start; the vLLM demo is tests/console/test_demo_vllm.py (headless).
Screenshots of the landing button and the finished comparison go to artifacts/e2e/."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts" / "e2e"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                 reason=f"Debian chromium is not installed at {CHROMIUM}")]


def test_one_click_demo_lands_on_the_comparison(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from playwright.sync_api import expect, sync_playwright
    from screenshots import ARGS, VIEWPORT, console

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    db = str(tmp_path / "empty.duckdb")
    with console(db, env={"METRONOME_DEMO_ENGINE": "twin"}) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url)
        button = page.get_by_role("button", name="Run the cliff vs slope demo")
        expect(button).to_be_visible(timeout=20_000)
        page.screenshot(path=str(ARTIFACTS / "demo-landing.png"))
        button.click()

        page.set_viewport_size(VIEWPORT)
        expect(page).to_have_url(f"{url}/experiments", timeout=20_000)
        # While the first run runs (the console's twin demo is paced), its charts are drawn
        # as they are written, beside the column the second run will take.
        # (The calibration comes first: on two cores shared with another test worker it has
        # taken most of a minute, so the bound is two.)
        expect(page.get_by_text("running now").first).to_be_visible(timeout=120_000)
        charts = page.locator('[data-testid="stVegaLiteChart"]')
        expect(charts.nth(2)).to_be_visible(timeout=20_000)  # latency, occupancy, silent
        page.wait_for_timeout(4000)  # a few refreshes: the pool has started to fill
        page.screenshot(path=str(ARTIFACTS / "demo-mid-run.png"), full_page=True)
        story = page.get_by_text("Same ", exact=False).filter(has_text="went silent")
        expect(story.first).to_be_visible(timeout=90_000)  # two paced runs of ~18 s
        expect(page.get_by_text("no silent frame").first).to_be_visible()
        expect(page.get_by_text("calibrated on").first).to_be_visible()
        expect(page.get_by_role("button", name="Download the report (HTML)")).to_be_visible()
        expect(charts.nth(5)).to_be_visible(timeout=20_000)  # 3 charts per run, side by side
        page.wait_for_timeout(2500)  # two refreshes: the charts have drawn
        # the form shows what the demo ran with, and it can show a cliff
        warnings = page.get_by_text("No cliff to show")
        try:
            expect(warnings).to_have_count(0)
        except AssertionError:
            raise AssertionError(f"the form warns: {warnings.all_inner_texts()}") from None
        page.screenshot(path=str(ARTIFACTS / "demo-comparison.png"), full_page=True)
        browser.close()
