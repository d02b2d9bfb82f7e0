"""One console process in a real browser: `streamlit run streamlit_app.py` serves the pages and,
on the same port, the gateway and the microphone page. A run started from the Load page (the
paced twin, shape `gateway`: remote clients only) takes the browser's microphone — Chromium's
fake capture device playing espeak-ng speech, not a mocked microphone — opened at /mic on the
console's own origin; the session shows on the console's Live page as origin `gateway`, with
its frames, while it speaks. Screenshots: artifacts/e2e/console-mic.png, console-live.png."""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.test_browser import ARGS, ARTIFACTS, CHROMIUM, _select, console  # noqa: F401
from tests.e2e.test_mic_browser import _speech_wav, _wait_for_frames

pytestmark = pytest.mark.slow


def _origin_rows(page) -> dict[str, list[str]]:
    """The Live page's sessions-by-origin table: origin → its cells."""
    rows = {}
    for tr in page.locator('[data-testid="stTable"] tbody tr').all():
        cells = [c.inner_text().strip() for c in tr.locator("th, td").all()]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_browser_mic_joins_the_consoles_run_and_shows_on_its_live_page(console, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    wav = _speech_wav(tmp_path)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            *ARGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}",
            "--autoplay-policy=no-user-gesture-required"])
        load = browser.new_page(viewport={"width": 1400, "height": 1800})
        load.goto(f"{console}/load")
        # Opened directly, the page is still the console's (its navigation, its sidebar), not
        # a page Streamlit found in a `pages/` folder beside the script.
        expect(load.get_by_text("database ")).to_be_visible(timeout=20_000)
        nav = load.locator('[data-testid="stSidebarNav"]')
        expect(nav).to_contain_text("Experiments")
        expect(nav).not_to_contain_text("console")
        _select(load, "Engine", "twin (simulated)")
        load.get_by_text("Paced (twin in real time)").click()
        _select(load, "KV policy", "window")
        load.get_by_role("spinbutton", name="W: window tokens", exact=True).fill("128")
        _select(load, "Shape", "gateway")
        load.get_by_role("spinbutton", name="Sessions N", exact=True).fill("2")
        load.get_by_role("spinbutton", name="Duration (s)", exact=True).fill("60")
        load.get_by_role("button", name="Start").click()
        expect(load.get_by_text("started: follow it on the Live page")).to_be_visible(
            timeout=15_000)
        # The Load page's button opens the console's own /mic.
        link = load.get_by_role("link", name="Open the microphone page")
        assert link.get_attribute("href") == "/mic"

        mic = browser.new_page(viewport={"width": 1000, "height": 1400})
        mic.goto(f"{console}/mic")
        mic.get_by_role("button", name="Start speaking").click()
        expect(mic.locator("#status")).to_contain_text("Live", timeout=20_000)
        _wait_for_frames(mic, 25, timeout_s=30)
        session = re.search(r"session (\d+) of run (\S+)",
                            mic.locator("#session").inner_text())
        assert session, mic.locator("#session").inner_text()

        live = browser.new_page(viewport={"width": 1400, "height": 2200})
        live.goto(console)  # the Live page follows the running run
        expect(live.get_by_text("Sessions from")).to_be_visible(timeout=20_000)
        deadline, rows = time.monotonic() + 20, {}
        while time.monotonic() < deadline:  # the table refreshes every second
            rows = _origin_rows(live)
            if "gateway" in rows and int(rows["gateway"][1]) >= 20:
                break
            live.wait_for_timeout(500)
        assert "gateway" in rows, rows
        sessions, frames = int(rows["gateway"][0]), int(rows["gateway"][1])
        assert sessions == 1 and frames >= 20, rows  # the mic's session, speaking
        mic_frames = int(mic.locator("#frames").inner_text())
        assert mic_frames >= 20
        live.screenshot(path=str(ARTIFACTS / "console-live.png"), full_page=True)
        mic.screenshot(path=str(ARTIFACTS / "console-mic.png"), full_page=True)
        mic.get_by_role("button", name="Stop").click()
        browser.close()
