"""A client that stops reading its socket: the server's queue for it stays at its bound, the
client is told (error slow_reader, close 1008) once it reads again, its session ends with the
reason recorded, and the sessions beside it lose no frame."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import urllib.request

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, Opcode
from websockets.uri import parse_uri

from gateway.outbox import POLICY, Outbox
from gateway.protocol import GatewayLimits
from tests.gateway.conftest import events, finish, frames, run_load

CHUNK = base64.b64encode(b"\x10\x00" * 640).decode()  # one 40 ms frame at 16 kHz
FRAME_S = 0.04


def test_the_outbox_gives_up_at_its_bound_and_keeps_only_the_goodbye():
    box = Outbox(asyncio.new_event_loop(), max_events=16)
    for k in range(1000):  # a run thread delivering to a client that never reads
        box.put("delta", {"frame_idx": k, "n": 1, "token_ids": None})
    assert box.overflowed.is_set() and box.peak == 16 and box.dropped == 1000
    left = [box.queue.get_nowait() for _ in range(box.queue.qsize())]
    assert [kind for kind, _ in left] == ["error", "fatal"]
    assert left[0][1]["error"]["code"] == "slow_reader" and left[1][1] == {"code": POLICY}
    assert box.reason == "slow reader: 16 events unread"


def test_queue_and_send_buffer_limits_name_the_bad_value():
    with pytest.raises(ValueError, match=r"max queued events 3 must be in \[16, 100000\]"):
        GatewayLimits(max_queued_events=3)
    with pytest.raises(ValueError, match=r"send buffer 10 bytes must be in \[4096"):
        GatewayLimits(send_buffer_bytes=10)


class _RawClient:
    """A WebSocket client on a bare socket with a small receive buffer: it reads only when
    asked, so the server's sends back up as for a client that stopped reading."""

    def __init__(self, url: str, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before the window
        self.sock.connect(("127.0.0.1", port))
        self.proto = ClientProtocol(parse_uri(url), max_size=None)
        self.proto.send_request(self.proto.connect())
        self._flush()
        self.first = self.read_until(lambda e: _opcode(e) is Opcode.TEXT)[-1]

    def _flush(self) -> None:
        self.sock.sendall(b"".join(self.proto.data_to_send()))

    def append(self) -> None:
        self.proto.send_text(json.dumps({"type": "input_audio_buffer.append",
                                         "audio": CHUNK}).encode())
        self._flush()

    def read_until(self, stop, timeout_s: float = 15.0) -> list:
        self.sock.settimeout(timeout_s)
        got = []
        while not any(stop(e) for e in got):
            data = self.sock.recv(65536)
            if not data:
                break
            self.proto.receive_data(data)
            got += self.proto.events_received()
        return got


def _opcode(event):
    return getattr(event, "opcode", None)  # the handshake's response has none


def _health(port: int) -> dict:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read())


@pytest.mark.slow
def test_a_client_that_never_reads_is_closed_and_the_others_lose_nothing(serve, tmp_path):
    server = serve("--sessions", "8", "--frame-ms", "40", "--max-queued-events", "32",
                   "--send-buffer-kb", "8", duration=10)
    load = run_load(server.url, tmp_path / "client.duckdb", "--sessions", "4", "--duration",
                    "7")
    slow = _RawClient(server.url, server.port)
    assert json.loads(slow.first.data)["type"] == "session.created"
    sid = json.loads(slow.first.data)["session"]["metronome"]["session_id"]
    start, peaks, health = time.monotonic(), [], {}
    for k in range(500):  # audio at real time, nothing read, until the server gives up
        time.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
        slow.append()
        if k % 10 == 0:
            health = _health(server.port)
            peaks.append(health["queue_peak_events"])
            if health["slow_readers"]:
                break
    assert health["slow_readers"] == 1, health
    assert max(peaks) <= 32  # the queue never outgrew its bound
    # Reading again, the client finds what its socket held, then why it was closed.
    got = slow.read_until(lambda e: _opcode(e) is Opcode.CLOSE)
    texts = [json.loads(e.data) for e in got if _opcode(e) is Opcode.TEXT]
    assert texts[-1]["type"] == "error" and texts[-1]["error"]["code"] == "slow_reader"
    assert Close.parse(got[-1].data).code == 1008
    slow.sock.close()

    client = finish(load)
    summary = server.summary()
    assert summary.status == "finished"
    assert client["admitted"] == 4 and client["silent_frames"] == 0
    assert client["missing_frames"] == 0
    others = frames(server.db, summary.run_id)
    others = others[others.session_id != sid]
    assert len(others) > 4 * 100 and not others.silent.any()
    closes = {d["session_id"]: d["reason"] for kind, d in events(server.db, summary.run_id)
              if kind == "close"}
    assert closes[sid] == "slow reader: 32 events unread"
