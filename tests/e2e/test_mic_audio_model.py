"""The browser microphone on the audio-in model: Debian Chromium with its fake capture device
playing espeak-ng speech speaks into `metronome serve --engine vllm --model audio-tiny`'s /mic
page, and every frame the server took from the page went through the model's processor and
encoder (one encoder frame and two audio tokens a frame, the processor's 4 tokens in each
prefill), not through the stand-in tokenizer. tests/e2e/test_mic_browser.py checks the page
itself (on the twin); this test checks where its audio goes on an audio-in model.
"""

from __future__ import annotations

import duckdb
import pytest

from tests.e2e.test_mic_browser import CHROMIUM, _speech_wav, _wait_for_frames
from tests.gateway.conftest import frames, serve  # noqa: F401 - serve is a fixture

FRAMES = 50  # 4 s of 80 ms frames: a loaded CI machine skips many of the first ones
HANDED_MIN = 10  # frames handed over: enough to see every one of them take the encoder path

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.skipif(
    not __import__("pathlib").Path(CHROMIUM).exists(),
    reason=f"Debian chromium is not installed at {CHROMIUM}")]


def test_the_mic_pages_frames_reach_the_audio_models_encoder(serve, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    wav = _speech_wav(tmp_path)
    server = serve("--engine", "vllm", "--model", "audio-tiny", "--pool-blocks", "64",
                   "--admission", "fixed", "--sessions", "1", "--frame-ms", "80",
                   duration=40, startup_s=300)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
            "--autoplay-policy=no-user-gesture-required"])
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.port}/mic")
        page.get_by_role("button", name="Start speaking").click()
        expect(page.locator("#status")).to_contain_text("Live", timeout=30_000)
        _wait_for_frames(page, FRAMES, timeout_s=60)
        page.get_by_role("button", name="Stop").click()
        expect(page.locator("#status")).to_contain_text("Stopped")
        browser.close()

    s = server.summary()
    assert s.status == "finished" and s.admitted == 1
    assert s.input_path == "audio encoder"
    assert s.input == "gateway audio through the model's audio encoder"
    rows = frames(server.db, s.run_id)
    assert set(rows.origin) == {"gateway"} and len(rows) >= FRAMES
    # Every frame not skipped (a frame whose previous one is still in flight is skipped, which
    # a loaded CI machine does: it handed over 10 of 25, skipping most of the first ones) was
    # handed over, and encoded once, as one frame of mel: 2 audio tokens. (A frame handed over
    # as the run ended may be dropped before its encode.) How many are skipped is a speed
    # figure, not this test's claim; it needs only enough handed frames to see the path.
    handed = int((~rows.skipped.astype(bool)).sum())
    assert handed >= HANDED_MIN, rows.skipped.tolist()
    assert handed - 2 <= s.audio.frames_submitted
    assert s.rollovers or s.audio.frames_submitted <= handed  # a rollover re-sends audio
    assert s.audio.frames_submitted - 2 <= s.audio.encoder_frames <= s.audio.frames_submitted
    assert s.audio.audio_tokens_per_frame == 2.0
    # The LM took what the processor made of each frame (bos, 2 audio, eos): whole frames of 4.
    with duckdb.connect(str(server.db), read_only=True) as con:
        prefill = [p for (p,) in con.execute(
            "SELECT prompt_tokens FROM steps WHERE run_id = ? AND prompt_tokens > 0",
            [s.run_id]).fetchall()]
    assert s.audio.tokens_in_per_frame == 4
    assert prefill and all(p % 4 == 0 for p in prefill), prefill[:20]
    # (A frame handed over as the run ended may never be scheduled.)
    assert 4 * (s.audio.frames_submitted - 2) <= sum(prefill) <= 4 * s.audio.frames_submitted
