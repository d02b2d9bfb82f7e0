"""`metronome serve` stopped by a real signal ends its run, not just its server: the client is
told its session closed, the summary prints (status aborted, the signal named), the store has
the run as aborted with its frames, and the exit code is 0, as `metronome run` does."""

from __future__ import annotations

import asyncio
import base64
import json
import signal

import duckdb
import pytest
import websockets

pytestmark = pytest.mark.slow
CHUNK = base64.b64encode(b"\x10\x00" * 1280).decode()  # one 80 ms frame at 16 kHz


async def _stream_then_signal(server, sig) -> list[dict]:
    """A live session: a second of audio at real time, then the signal; what came back."""
    got = []
    async with websockets.connect(server.url, ping_interval=None) as ws:
        got.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
        for _ in range(12):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": CHUNK}))
            await asyncio.sleep(0.08)
        server.proc.send_signal(sig)
        try:
            async with asyncio.timeout(15):
                async for message in ws:
                    got.append(json.loads(message))
        except websockets.exceptions.ConnectionClosed:
            pass
    return got


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_ends_the_run_with_its_summary(serve, sig):
    server = serve("--sessions", "4", duration=120)
    got = asyncio.run(_stream_then_signal(server, sig))
    summary = server.summary(timeout=30)  # exit code 0 and the JSON summary on stdout

    assert got[0]["type"] == "session.created"
    assert any(e["type"] == "response.done" for e in got), "no frame was served before"
    closed = [e for e in got if e["type"] == "error"]
    assert closed and closed[-1]["error"]["code"] == "session_closed"
    assert summary.status == "aborted"
    assert summary.reason == f"interrupted by signal {sig.name}"
    with duckdb.connect(str(server.db), read_only=True) as con:
        status, reason = con.execute("SELECT status, reason FROM runs WHERE run_id = ?",
                                     [summary.run_id]).fetchone()
        frames = con.execute("SELECT count(*) FROM frames WHERE run_id = ?",
                             [summary.run_id]).fetchone()[0]
    assert (status, reason) == ("aborted", f"interrupted by signal {sig.name}")
    assert frames >= 5
