"""A token at the door. Bound beyond loopback — 127.0.0.2 stands in for a remote interface
(gateway/door.py counts only 127.0.0.1, ::1 and localhost as loopback) — `metronome serve` and
the console ask every client for the token: without it /v1/realtime, the pages and a control
action (the console's own WebSocket, through which Controls and Load act) get 401 and a line
in the log, and nothing reaches the run; with it, as the OpenAI SDK sends it or as the printed
URL's cookie, everything works. On loopback nothing is asked (every other gateway test)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import websockets

from gateway.door import Door
from tests.gateway.conftest import ROOT, finish, free_port, run_load

pytestmark = pytest.mark.slow
TOKEN = "t0ken-for-the-door-test-0123456789"
REMOTE = "127.0.0.2"


def _can_bind_remote() -> bool:
    with socket.socket() as s:
        try:
            s.bind((REMOTE, 0))
        except OSError:
            return False
    return True


needs_remote = pytest.mark.skipif(not _can_bind_remote(), reason=f"{REMOTE} cannot be bound")


def test_the_door_is_open_on_loopback_only():
    assert Door.for_host("127.0.0.1").token is None and Door.for_host("::1").token is None
    assert Door.for_host("localhost").token is None
    made = Door.for_host("0.0.0.0")
    assert made.token and len(made.token) >= 16 and not made.admits(None)
    assert not made.admits("wrong") and made.admits(made.token)
    with pytest.raises(ValueError, match="too short"):
        Door("short")


async def _ws_status(url: str, headers: dict | None = None,
                     first: bool = True) -> tuple[int | None, dict | None]:
    """The handshake's refusal status (None: accepted) and, with `first`, the first event."""
    try:
        async with websockets.connect(url, additional_headers=headers, open_timeout=5) as ws:
            return None, json.loads(await asyncio.wait_for(ws.recv(), 5)) if first else None
    except websockets.exceptions.InvalidStatus as exc:
        return exc.response.status_code, None


@needs_remote
def test_serve_beyond_loopback_asks_for_the_token(tmp_path):
    port = free_port()
    env = {**os.environ, "METRONOME_LOG": "WARNING", "METRONOME_TOKEN": TOKEN}
    err = open(tmp_path / "serve.err", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--engine", "twin", "--host", REMOTE,
         "--port", str(port), "--db", str(tmp_path / "s.duckdb"), "--duration", "20",
         "--policy", "window", "--window", "128", "--sessions", "4", "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while "listening" not in Path(err.name).read_text():
            assert proc.poll() is None and time.monotonic() < deadline, \
                Path(err.name).read_text()[-2000:]
            time.sleep(0.1)
        announced = Path(err.name).read_text()
        assert f"?token={TOKEN}" in announced and f"Bearer {TOKEN}" in announced
        url = f"ws://{REMOTE}:{port}/v1/realtime"
        status, _ = asyncio.run(_ws_status(url))
        assert status == 401
        status, _ = asyncio.run(_ws_status(url, {"Authorization": "Bearer nope"}))
        assert status == 401
        status, first = asyncio.run(_ws_status(url, {"Authorization": f"Bearer {TOKEN}"}))
        assert status is None and first["type"] == "session.created"
        with pytest.raises(urllib.error.HTTPError) as page:
            urllib.request.urlopen(f"http://{REMOTE}:{port}/mic", timeout=5)
        assert page.value.code == 401
        # The load client sends it as the SDK does; without it every session is refused.
        client = finish(run_load(url, tmp_path / "c.duckdb", "--sessions", "2", "--duration",
                                 "2", "--token", TOKEN))
        assert client["admitted"] == 2 and client["silent_frames"] == 0
    finally:
        proc.terminate()
        proc.wait(30)
        err.close()
    log = Path(err.name).read_text()
    assert log.count("refused websocket /v1/realtime") == 2  # one line per refusal
    assert "refused http /mic" in log


@needs_remote
def test_the_console_beyond_loopback_asks_for_the_token(tmp_path):
    port = free_port()
    env = {**os.environ, "METRONOME_DB": str(tmp_path / "c.duckdb"), "METRONOME_TOKEN": TOKEN,
           "METRONOME_METRICS_PORT": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "streamlit_app.py"),
         "--server.port", str(port), "--server.address", REMOTE],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://{REMOTE}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2)  # open: no data
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
        for path in ("/", "/mic", "/metrics", "/live"):
            with pytest.raises(urllib.error.HTTPError) as page:
                urllib.request.urlopen(base + path, timeout=5)
            assert page.value.code == 401, path
        # A control action goes through Streamlit's own WebSocket: refused at the handshake.
        stream = f"ws://{REMOTE}:{port}/_stcore/stream"
        assert asyncio.run(_ws_status(stream, first=False))[0] == 401
        assert asyncio.run(_ws_status(f"ws://{REMOTE}:{port}/v1/realtime"))[0] == 401
        # The printed URL sets the cookie; with it the pages and the console's socket open.
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(f"{base}/?token={TOKEN}", timeout=10) as page:
            assert page.status == 200 and "token" not in page.url  # redirected, clean URL
        with opener.open(f"{base}/mic", timeout=10) as page:
            assert page.status == 200
        cookie = f"metronome_token={TOKEN}"
        status, _ = asyncio.run(_ws_status(stream, {"Cookie": cookie}, first=False))
        assert status is None  # through the door to Streamlit's own socket
        status, first = asyncio.run(_ws_status(f"ws://{REMOTE}:{port}/v1/realtime",
                                               {"Authorization": f"Bearer {TOKEN}"}))
        assert status is None and first["error"]["code"] == "no_run"  # in, and told why
    finally:
        proc.terminate()
        proc.wait(30)
