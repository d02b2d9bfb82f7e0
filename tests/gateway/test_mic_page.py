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
    assert client.get("/healthz").json() == {"run": None, "connections": 0}
    with client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["error"]["code"] == "no_run"
