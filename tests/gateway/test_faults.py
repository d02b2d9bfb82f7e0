"""Clients that misbehave end only their own session: malformed JSON gets an error and the
session goes on (the 10th closes it), a 300 KB message gets an error and a close, a 50 MB one
and 10× real time get closed, a flood of messages is rate limited, a client that disconnects
mid-run keeps its frames; the run finishes and the load client's sessions lose nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
import websockets

from tests.gateway.conftest import events, finish, frames, run_load

pytestmark = pytest.mark.slow
FRAME = 1920  # samples of one 80 ms frame at 24 kHz (a session's rate until it asks another)
CHUNK = base64.b64encode(b"\x10\x00" * FRAME).decode()


async def _open(url):
    ws = await websockets.connect(url, max_size=None, ping_interval=None)
    first = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert first["type"] == "session.created", first
    return ws, first["session"]["metronome"]["session_id"]


async def _errors_until_closed(ws, timeout=5.0) -> list[str]:
    codes = []
    try:
        async with asyncio.timeout(timeout):
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "error":
                    codes.append(event["error"]["code"])
    except websockets.exceptions.ConnectionClosed:
        pass
    except TimeoutError:  # still open: the caller's assertion on the close code says so
        codes.append("still open")
    return codes


async def _append(ws, n=1):
    for _ in range(n):
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": CHUNK}))


async def _malformed(url):
    ws, _ = await _open(url)
    await ws.send("{not json")
    await _append(ws, 3)  # the session goes on after one bad event
    got = []
    async with asyncio.timeout(5):
        while "metronome.frame" not in got:
            event = json.loads(await ws.recv())
            got.append(event["error"]["code"] if event["type"] == "error" else event["type"])
    await ws.close()
    return got


async def _garbage(url):
    ws, _ = await _open(url)
    for _ in range(10):
        await ws.send("{not json")
    return await _errors_until_closed(ws), ws.close_code


async def _too_large(url):
    ws, _ = await _open(url)  # above --max-message-kb (256), below what uvicorn refuses unread
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 300_000}))
    return await _errors_until_closed(ws), ws.close_code


async def _flood(url):
    ws, _ = await _open(url)
    # Send until the server closes: the limit counts messages per second as the server
    # receives them, and on 2 loaded cores this loop (sharing its event loop with six other
    # faulty clients, one writing 50 MB) may take longer than a second for 250 messages.
    try:
        for _ in range(20_000):
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    except websockets.exceptions.ConnectionClosed:
        pass
    return await _errors_until_closed(ws), ws.close_code


async def _huge(url):
    ws, _ = await _open(url)
    try:
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": "A" * (50 * 1024 * 1024)}))
    except websockets.exceptions.ConnectionClosed:
        pass
    await _errors_until_closed(ws)
    return ws.close_code


async def _too_fast(url):
    ws, _ = await _open(url)
    start = time.monotonic()
    try:
        for k in range(400):  # 10× real time: a frame every 8 ms
            await asyncio.sleep(max(0.0, start + k * 0.008 - time.monotonic()))
            await _append(ws)
    except websockets.exceptions.ConnectionClosed:
        pass
    return await _errors_until_closed(ws), ws.close_code


async def _disconnect_mid_run(url):
    ws, sid = await _open(url)
    for _ in range(25):  # 2 s of audio at real time, then gone mid-frame
        await _append(ws)
        await asyncio.sleep(0.08)
    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                              "audio": base64.b64encode(b"\0\0" * 300).decode()}))
    ws.transport.abort()  # no close handshake: the connection just drops
    return sid


async def _faults(url):
    await asyncio.sleep(1.0)  # the load client's sessions are up first
    return await asyncio.gather(_malformed(url), _huge(url), _too_fast(url),
                                _disconnect_mid_run(url), _garbage(url), _too_large(url),
                                _flood(url))


def test_faulty_clients_end_only_their_own_session(serve, tmp_path):
    server = serve("--sessions", "16", duration=12)
    load = run_load(server.url, tmp_path / "client.duckdb", "--sessions", "6",
                    "--duration", "7")
    malformed, huge_code, (fast_errors, fast_code), gone, garbage, large, flood = \
        asyncio.run(_faults(server.url))
    client = finish(load)
    summary = server.summary()

    assert malformed[0] == "invalid_json" and "metronome.frame" in malformed
    assert garbage == (["invalid_json"] * 9 + ["invalid_json", "too_many_errors"], 1008)
    assert large == (["message_too_large"], 1009)
    assert flood[0][-1] == "rate_limited" and flood[1] == 1008
    assert huge_code == 1009  # message too big: refused before it was read
    assert "input_audio_buffer_overflow" in fast_errors and fast_code == 1008
    assert summary.status == "finished"
    # The load client's sessions: every frame answered, none silent, nothing missing.
    assert client["admitted"] == 6 and client["frames"] > 6 * 70
    assert client["silent_frames"] == 0 and client["missing_frames"] == 0
    served = frames(server.db, summary.run_id)
    assert summary.silent_frames == 0
    mid = served[served.session_id == gone]
    assert list(mid.frame_idx) == list(range(25))  # its frames up to the drop; no partial one
    closes = {d["session_id"]: d["reason"] for kind, d in events(server.db, summary.run_id)
              if kind == "close"}
    assert closes[gone] == "client disconnected"
