"""A transparent WebSocket relay that logs what crosses it: a witness of a realtime load that is
neither the client nor the server.

The load client's own record says how many frames it sent and which got deltas; checking that
record against itself proves nothing. The tap sits between them on loopback, forwards every
message unchanged in both directions, and notes each one's type and arrival time on its own
clock. From that log, `frames_by_tap` rebuilds per session the frames sent (one per append)
and the deltas each frame got, by the client's rule for a server without frame markers (the
latest frame sent before the delta, while its deadline has not passed) or by the server's
`metronome.frame_idx` where it marks them. Relaying costs a message well under a millisecond on
loopback; it is the same for both servers a benchmark compares.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from dataclasses import dataclass, field

import websockets

DELTAS = ("transcription.delta", "response.output_text.delta", "response.text.delta",
          "response.output_audio_transcript.delta", "response.audio_transcript.delta")


@dataclass
class Note:
    conn: int
    t: float
    upstream: bool  # True: client → server
    type: str
    frame_idx: int | None = None
    server_session: object = None
    tokens: int = 1  # a delta's metronome.tokens (Metronome merges a frame's tokens), else 1


@dataclass
class Tap:
    upstream: str  # ws://host:port (the path is the client's)
    notes: list = field(default_factory=list)
    port: int | None = None

    def __post_init__(self) -> None:
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ws-tap")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the tap did not start in 10 s")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._server = await websockets.serve(self._relay, "127.0.0.1", 0, compression=None,
                                              max_size=16 * 1024 * 1024, ping_interval=None)
        self.port = self._server.sockets[0].getsockname()[1]

    def save(self, path) -> None:
        """The log as JSON lines (one message each), to check a run again later."""
        with open(path, "w") as f:
            for note in self.notes:
                f.write(json.dumps(note.__dict__, default=str) + "\n")

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _note(self, conn: int, upstream: bool, message) -> None:
        t = time.perf_counter()
        try:
            event = json.loads(message)
        except (TypeError, ValueError):
            event = {}
        event = event if isinstance(event, dict) else {}
        meta = event.get("metronome") if isinstance(event.get("metronome"), dict) else {}
        session = event.get("session") if isinstance(event.get("session"), dict) else {}
        created = (session.get("metronome") or {}).get("session_id", event.get("id")) \
            if event.get("type") == "session.created" else None
        tokens = meta.get("tokens")
        self.notes.append(Note(conn, t, upstream, str(event.get("type")),
                               meta.get("frame_idx"), created,
                               tokens if isinstance(tokens, int) and tokens > 0 else 1))

    async def _relay(self, client) -> None:
        conn = next(self._ids)
        async with websockets.connect(self.upstream + client.request.path, compression=None,
                                      max_size=16 * 1024 * 1024, ping_interval=None) as server:
            async def pump(src, dst, upstream: bool) -> None:
                async for message in src:
                    self._note(conn, upstream, message)
                    await dst.send(message)

            tasks = [asyncio.create_task(pump(client, server, True)),
                     asyncio.create_task(pump(server, client, False))]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()


def frames_by_tap(notes: list[Note], budget_ms: float) -> dict:
    """{(server_session, frame_idx): tokens} for every frame sent (an append is a frame): a
    delta counts its metronome.tokens, else 1, as the client counts it; the tokens no frame
    could take go under (server_session, None)."""
    out: dict = {}
    for conn in sorted({n.conn for n in notes}):
        mine = sorted((n for n in notes if n.conn == conn), key=lambda n: n.t)
        session = next((n.server_session for n in mine if n.server_session is not None), conn)
        sent: list[float] = []
        for note in mine:
            if note.upstream and note.type == "input_audio_buffer.append":
                sent.append(note.t)
                out[(session, len(sent) - 1)] = 0
            elif not note.upstream and note.type in DELTAS:
                idx = note.frame_idx
                if idx is None and sent and note.t <= sent[-1] + budget_ms / 1e3:
                    idx = len(sent) - 1
                key = (session, idx) if idx is not None and (session, idx) in out \
                    else (session, None)
                out[key] = out.get(key, 0) + note.tokens
    return out


def segment_delays_ms(notes: list[Note], frame_ms: float, segment_s: float) -> list[float]:
    """For a server that answers per segment of audio (vLLM's Qwen3-ASR: 5 s): per session and
    segment, the time from the append that completed the segment's audio to the first delta
    after it, on the tap's clock. The client cannot see this without frame markers (it maps
    each delta to the frame sent last); the tap sees the whole stream."""
    out = []
    per_segment = segment_s * 1e3 / frame_ms  # appends per segment, one frame each
    for conn in sorted({n.conn for n in notes}):
        mine = sorted((n for n in notes if n.conn == conn), key=lambda n: n.t)
        sent = [n.t for n in mine if n.upstream and n.type == "input_audio_buffer.append"]
        deltas = [n.t for n in mine if not n.upstream and n.type in DELTAS]
        b = 1
        while math.ceil(b * per_segment - 1e-9) <= len(sent):
            t_complete = sent[math.ceil(b * per_segment - 1e-9) - 1]  # its last sample is in
            after = [t for t in deltas if t >= t_complete]
            if after:
                out.append((after[0] - t_complete) * 1e3)
            b += 1
    return out
