"""The operator's microphone page in a real browser: Debian Chromium (through Playwright) with
its fake capture device playing a speech WAV made by espeak-ng, not a mocked microphone,
speaks ~5 s into `metronome serve --engine twin`'s /mic page. The server's record must hold
that session's frames (origin gateway), each fed the tokenizer's tokens_in tokens of the audio
the page sent at 16 kHz, and the page must show the latencies the server recorded. A second
page while the one slot is held is refused with server_overloaded, and a refused microphone
says so. The screenshot goes to /tmp/mic_page.png (and artifacts/e2e/mic.png).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from load_gen.audio import voice_active
from load_gen.tokenizer import frame_tokenizer
from tests.gateway.conftest import frames, serve  # noqa: F401 - serve is a fixture

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
SHOT = Path("/tmp/mic_page.png")
ARTIFACTS = ROOT / "artifacts" / "e2e"
RATE = 16_000
FRAME_MS = 80.0
SPEAK_FRAMES = 62  # ~5 s of 80 ms frames
TWIN_VOCAB = 2048  # the twin's vocabulary (engine/twin.py), which the server's tokenizer uses
TEXT = ("Metronome keeps the beat while the model listens and answers. "
        "The quick brown fox jumps over the lazy dog.")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"Debian chromium is not installed at {CHROMIUM}")]


def _speech_wav(tmp_path: Path) -> Path:
    """~5 s of espeak-ng speech with 0.5 s of silence either side, 48 kHz 16-bit mono (the
    fake device's own rate: the browser's resampling is the page's worklet, not Chromium's)."""
    missing = [t for t in ("espeak-ng", "sox") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (`bash scripts/setup.sh test`)")
    raw, out = tmp_path / "raw.wav", tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), TEXT], check=True, capture_output=True)
    trim = ("silence", "1", "0.01", "0.1%")  # as tests/load_gen/speechfiles.py cuts espeak's ends
    subprocess.run(["sox", str(raw), "-b", "16", "-c", "1", str(out), *trim, "reverse", *trim,
                    "reverse", "trim", "0", "5", "rate", "48000", "pad", "0.5", "0.5"],
                   check=True, capture_output=True)
    return out


def _rows(page) -> list[dict]:
    """The per-frame table as the page shows it (newest first)."""
    rows = []
    for tr in page.locator("#rows tr").all():
        cells = [c.inner_text().strip() for c in tr.locator("td").all()]
        rows.append({"frame_idx": int(cells[0]), "latency": cells[1],
                     "silent": cells[4].startswith("silent")})
    return rows


def _wait_for_frames(page, n: int, timeout_s: float) -> None:
    # Polled from here, not page.wait_for_function: the page's CSP allows no eval.
    deadline = time.monotonic() + timeout_s
    while int(page.locator("#frames").inner_text()) < n:
        assert time.monotonic() < deadline, page.locator("#status").inner_text()
        page.wait_for_timeout(200)


def _same_latency(shown: str, row) -> bool:
    """The page's text (one decimal; `> x` for a frame that never finished) is the row's."""
    censored = shown.startswith("> ")
    if censored != pd.isna(row.latency_ms):
        return False
    truth = row.latency_bound_ms if censored else row.latency_ms
    return abs(float(shown.removeprefix("> ")) - truth) <= 0.05 + 1e-9


def test_mic_page_speaks_into_the_gateway_and_shows_the_recorded_latency(serve, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    wav = _speech_wav(tmp_path)
    # One slot, so a second page is refused while the first speaks.
    server = serve("--admission", "fixed", "--sessions", "1", "--frame-ms", str(FRAME_MS),
                   duration=25)
    mic_url = f"http://127.0.0.1:{server.port}/mic"
    sent: list[bytes] = []  # the PCM16 the page put on the wire, append by append

    def on_socket(ws):
        def on_sent(payload):
            event = json.loads(payload) if isinstance(payload, str) else {}
            if event.get("type") == "input_audio_buffer.append":
                sent.append(base64.b64decode(event["audio"]))
        ws.on("framesent", on_sent)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
            "--autoplay-policy=no-user-gesture-required"])
        page = browser.new_page(viewport={"width": 1000, "height": 1400})
        page.on("websocket", on_socket)
        page.goto(mic_url)
        page.get_by_role("button", name="Start speaking").click()
        expect(page.locator("#status")).to_contain_text("Live", timeout=15_000)
        _wait_for_frames(page, SPEAK_FRAMES, timeout_s=30)

        # The slot is held: a second operator is told the server is full.
        other = browser.new_page()
        other.goto(mic_url)
        other.get_by_role("button", name="Start speaking").click()
        expect(other.locator("#status")).to_contain_text("server is full", timeout=15_000)
        expect(other.locator("#status")).to_contain_text("server_overloaded")

        # A refused microphone (the browser's NotAllowedError) is explained, and no session
        # is asked for.
        refused = browser.new_page()
        refused.add_init_script("navigator.mediaDevices.getUserMedia = () => Promise.reject("
                                "new DOMException('Permission denied', 'NotAllowedError'));")
        refused.goto(mic_url)
        refused.get_by_role("button", name="Start speaking").click()
        expect(refused.locator("#status")).to_contain_text("The microphone was refused")

        last_latency = page.locator("#last-latency").inner_text()
        words = page.locator("#words").inner_text()
        session_line = page.locator("#session").inner_text()
        SHOT.unlink(missing_ok=True)
        page.screenshot(path=str(SHOT), full_page=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHOT, ARTIFACTS / "mic.png")
        page.get_by_role("button", name="Stop").click()
        expect(page.locator("#status")).to_contain_text("Stopped")
        shown = _rows(page)
        page_frames = int(page.locator("#frames").inner_text())
        browser.close()

    summary = server.summary()
    assert summary.status == "finished"
    assert (summary.admitted, summary.rejected) == (1, 1)  # the refused mic never asked
    sid = int(re.search(r"session (\d+) of run (\S+)", session_line).group(1))
    assert f"of run {summary.run_id}" in session_line
    rows = frames(server.db, summary.run_id)
    assert set(rows.origin) == {"gateway"} and set(rows.session_id) == {sid}

    # Every whole frame of audio the page sent is a frame of the record, in order; the
    # partial frame at Stop is not a frame.
    audio = np.frombuffer(b"".join(sent), dtype="<i2").astype(np.float32) / 32768.0
    tok = frame_tokenizer(RATE, FRAME_MS, summary.tokens_in, TWIN_VOCAB)
    whole = len(audio) // tok.frame_samples
    assert list(rows.frame_idx) == list(range(len(rows)))
    assert page_frames <= len(rows) and whole - 1 <= len(rows) <= whole, (len(rows), whole)
    # Sent at 16 kHz in real time: the server took the frames one period apart (a page that
    # sent at the wrong rate runs ahead, overflows, or leaves the server waiting).
    span = rows.t_submit.iloc[-1] - rows.t_submit.iloc[0]
    expected = (len(rows) - 1) * FRAME_MS / 1e3
    assert 0.9 * expected <= span <= 1.15 * expected, (span, expected)

    # Tokens in per frame as the tokenizer makes them: the engine was fed tokens_in tokens per
    # submitted frame (its prefill steps; the only session of the run), ...
    with duckdb.connect(str(server.db), read_only=True) as con:
        prefill = con.execute("SELECT prompt_tokens FROM steps WHERE run_id = ? AND "
                              "prompt_tokens > 0", [summary.run_id]).fetchall()
    submitted = int((~rows.skipped.astype(bool)).sum())
    assert {p for (p,) in prefill} == {summary.tokens_in}
    assert len(prefill) == submitted, (len(prefill), submitted)
    # ... and those tokens are of speech: the audio the page sent, cut and tokenized as the
    # server does, is voiced where espeak spoke and gives many codes, not one (silence).
    # (The first ~5 s: the file's 0.5 s lead-in, then speech; later the capture loops.)
    cut = [audio[k * tok.frame_samples:(k + 1) * tok.frame_samples]
           for k in range(SPEAK_FRAMES)]
    voiced = [f for f in cut if voice_active(f)]
    assert len(voiced) >= 0.6 * len(cut), (len(voiced), len(cut))
    ids = np.concatenate([tok.tokenize(f) for f in voiced])
    assert len(ids) == len(voiced) * summary.tokens_in
    assert len(set(ids.tolist())) > 50, len(set(ids.tolist()))

    # The page shows the model's words: the output ids the server recorded, decoded (the
    # twin's made-up ids, through the tiny model's tokenizer it stands in for).
    from engine.models import resolve_model
    from engine.text import TextCodec

    ids_out = [int(i) for out in rows.sort_values("frame_idx").out_ids if out is not None
               for i in out]
    said = TextCodec(resolve_model("tiny"), TWIN_VOCAB).decode(ids_out)
    assert words.strip() and "·" not in words
    # (The box keeps the last 2,000 characters: a stretch of what the server decoded.)
    assert words.strip()[:200] in said, (words[:80], said[:80])

    # The page shows the latency the server recorded, frame by frame.
    assert re.fullmatch(r"(> )?\d+\.\d ms", last_latency), last_latency
    by_idx = rows.set_index("frame_idx")
    assert len(shown) == 10
    for r in shown:
        truth = by_idx.loc[r["frame_idx"]]
        assert _same_latency(r["latency"], truth), (r, truth.to_dict())
        assert r["silent"] == bool(truth.silent)
