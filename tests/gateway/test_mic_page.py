"""The microphone page's routes on the gateway's own app: the page and its two scripts are
served, the page loads what the routes serve, and nothing else under /mic reaches a file."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from gateway import mic
from gateway.server import Gateway


@pytest.fixture
def client():
    # No run serving: the page is still there (it is static; the session is asked for later).
    return TestClient(Gateway(lambda: None).app())


def test_the_page_and_its_scripts_are_served_by_the_gateway_app(client):
    page = client.get("/mic")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-store"
    scripts = re.findall(r'<script src="([^"]+)"', page.text)
    assert scripts == ["/mic/mic.js"]
    js = client.get(scripts[0])
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    # The worklet the page loads is one the routes serve, and it registers what the page
    # instantiates.
    (worklet_url,) = re.findall(r'addModule\("([^"]+)"\)', js.text)
    (processor,) = re.findall(r'new AudioWorkletNode\(ctx, "([^"]+)"\)', js.text)
    worklet = client.get(worklet_url)
    assert worklet.status_code == 200
    assert f'registerProcessor("{processor}"' in worklet.text
    # The page speaks the gateway's protocol on the same host.
    assert "/v1/realtime" in js.text and "input_audio_buffer.append" in js.text
    assert "server_overloaded" in js.text


@pytest.mark.parametrize("path", ["/mic/nope.js", "/mic/..%2Fserver.py", "/mic/mic.html",
                                  "/mic/%2E%2E%2Fprotocol.py"])
def test_only_the_listed_files_are_served(client, path):
    assert client.get(path).status_code == 404


def test_a_missing_static_file_is_a_clear_500(client, monkeypatch, tmp_path):
    monkeypatch.setattr(mic, "STATIC", tmp_path)
    answer = client.get("/mic")
    assert answer.status_code == 500 and "not installed" in answer.text


def test_healthz_and_realtime_are_still_there(client):
    health = client.get("/healthz").json()
    assert (health["run"], health["connections"], health["slow_readers"]) == (None, 0, 0)
    with client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["error"]["code"] == "no_run"


# The worklet run in node with the audio thread's globals stubbed: 1 s of a 440 Hz tone at the
# device's rate, in 128-sample render quanta as the browser calls it.
_WORKLET_HARNESS = """
const fs = require("fs");
let Proc = null;
const posted = [];
globalThis.sampleRate = Number(process.argv[3]);
globalThis.AudioWorkletProcessor = class { constructor() { this.port = {postMessage: (b) =>
  posted.push(Buffer.from(b))}; } };
globalThis.registerProcessor = (name, cls) => { Proc = cls; };
eval(fs.readFileSync(process.argv[2], "utf8"));
const p = new Proc();
for (let start = 0; start < sampleRate; start += 128) {
  const block = new Float32Array(128).map((_, i) =>
    0.5 * Math.sin(2 * Math.PI * 440 * (start + i) / sampleRate));
  p.process([[block]]);
}
process.stdout.write(Buffer.concat(posted).toString("base64"));
"""


@pytest.mark.parametrize("device_hz", [48_000, 44_100, 16_000])
def test_the_worklet_makes_16_khz_little_endian_pcm16_in_real_time(device_hz, tmp_path):
    import base64
    import shutil
    import subprocess

    import numpy as np

    if shutil.which("node") is None:
        pytest.skip("node is not installed: the worklet is checked in Chromium only")
    harness = tmp_path / "harness.js"
    harness.write_text(_WORKLET_HARNESS)
    out = subprocess.run(["node", str(harness), str(mic.STATIC / "mic-worklet.js"),
                          str(device_hz)], capture_output=True, text=True, timeout=30, check=True)
    pcm = np.frombuffer(base64.b64decode(out.stdout), dtype="<i2").astype(np.float64) / 32768
    # One second in, one second out (less the last partial 20 ms chunk, not yet posted).
    assert 16_000 - 320 < len(pcm) <= 16_000 and len(pcm) % 320 == 0
    # The tone is still 440 Hz at 16 kHz and keeps its level (the box filter barely touches
    # the speech band); a wrong ratio or byte order moves or smears the peak.
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    peak_hz = np.argmax(spectrum) * 16_000 / len(pcm)
    assert abs(peak_hz - 440) < 3, peak_hz
    rms = np.sqrt(np.mean(pcm ** 2))
    assert 0.33 < rms < 0.36, rms  # 0.5/√2 ≈ 0.354, minus the box filter's ~1 % at 440 Hz
