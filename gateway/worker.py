"""A gateway worker process: `/v1/realtime` on the public port (SO_REUSEPORT, so the kernel
spreads connections over the workers), its sessions served by the run process over a link
(gateway/link.py). Started by `metronome serve --workers K` (gateway/serve.py), never by hand:

    python -m gateway.worker LINK_PATH HOST PORT

The connection's whole per-frame path runs here (the same `Gateway` as one process serves:
WebSocket, JSON, base64, resampling, the stand-in tokenizer); the run process gets the frames'
token ids and sends back the connection's events. The worker exits when the link closes (the
run ended, or the run process is gone).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from dataclasses import dataclass

import uvicorn

from gateway.door import Door
from gateway.link import Wire, read_items
from gateway.server import Gateway, Target
from load_gen.remote import AudioCutter, BufferFull, buffer_full
from load_gen.tokenizer import frame_tokenizer

logger = logging.getLogger(__name__)


class WorkerFrames:
    """A connection's audio in a worker: cut and tokenized here, each batch of whole frames
    sent down the link at once. The interface the receiver uses (gateway/client_events.py).

    Buffered audio is bounded here too, by what the run has not recorded yet: the frames sent
    minus the last recorded row's, less the one frame in flight (its row comes after its
    deadline), plus the partial one. A client ahead of real time by more is refused as in one
    process (BufferFull)."""

    def __init__(self, wire: Wire, cid: int, cutter: AudioCutter, max_buffer_s: float,
                 audio: bool) -> None:
        self.wire, self.cid, self.cutter = wire, cid, cutter
        self._max_s = max(cutter.tokenizer.frame_s, max_buffer_s)
        self._audio = audio  # the engine takes the frame's audio: it goes too
        self.recorded = -1  # the last frame whose row came back
        self.end_reason: str | None = None

    def set_rate(self, rate_hz: int) -> None:
        self.cutter.set_rate(rate_hz)

    def append(self, samples) -> None:
        if self.end_reason is not None:
            return
        cutter = self.cutter
        unrecorded = max(0, cutter.frames_cut - self.recorded - 2)
        ahead_s = (unrecorded * cutter.tokenizer.frame_s
                   + (cutter.pending + len(samples)) / cutter.rate_hz)
        if ahead_s > self._max_s + 0.5 / cutter.rate_hz:
            raise BufferFull(buffer_full(ahead_s, self._max_s))
        frames = cutter.cut(samples)
        if frames:
            self.wire.send(("frames", self.cid, [
                (f.token_ids, f.voice_active, f.audio.tobytes() if self._audio else None)
                for f in frames], time.perf_counter()))

    def add_text(self, ids: list[int]) -> None:
        self.wire.send(("text", self.cid, ids))

    def clear(self) -> int:
        self.wire.send(("clear", self.cid))
        return self.cutter.clear()  # the partial frame; the run drops what it buffered

    def turn_end(self) -> None:
        self.wire.send(("commit", self.cid))  # the run knows what it took: it answers


@dataclass(eq=False)
class WorkerClient:
    cid: int
    frames: WorkerFrames


class LinkInlet:
    """What the worker's Gateway takes for the run's inlet (connect, disconnect)."""

    def __init__(self, wire: Wire, hello: dict) -> None:
        self.wire, self.hello = wire, hello
        self.tokenizer = frame_tokenizer(*hello["tokenizer"])
        self._listeners: dict[int, tuple] = {}
        self._next = 0

    def connect(self, listener) -> WorkerClient:
        cid, self._next = self._next, self._next + 1
        frames = WorkerFrames(self.wire, cid, AudioCutter(self.tokenizer),
                              self.hello["max_buffer_s"], self.hello["audio"])
        self._listeners[cid] = (listener, frames)
        self.wire.send(("connect", cid))
        return WorkerClient(cid, frames)

    def disconnect(self, client: WorkerClient, reason: str) -> None:
        if self._listeners.pop(client.cid, None) is not None:
            client.frames.end_reason = reason
            self.wire.send(("end", client.cid, reason))

    def dispatch(self, cid: int, kind: str, data) -> None:
        """An event of the run for connection `cid` (on the worker's event loop)."""
        entry = self._listeners.get(cid)
        if entry is None:
            return  # the connection is gone
        listener, frames = entry
        if kind == "frame":
            frames.recorded = max(frames.recorded, data["row"]["frame_idx"])
        elif kind in ("closed", "rejected"):
            frames.end_reason = data["reason"]
            self._listeners.pop(cid, None)
        listener.deliver(kind, data)


def listening_socket(host: str, port: int) -> socket.socket:
    """The public port, shared by every worker (SO_REUSEPORT: the kernel balances accepts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, as uvicorn names it: asyncio sets TCP_NODELAY only on sockets whose
    # proto says TCP, and without it Nagle held a frame's small writes behind the client's
    # delayed ACK (~35 ms a frame in gateway_overhead.py at 1 session).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def run_worker(link: str, host: str, port: int) -> None:
    reader, writer = await asyncio.open_unix_connection(link)
    wire = Wire(asyncio.get_running_loop(), writer)
    (kind, hello), *_ = await read_items(reader)
    assert kind == "hello", kind
    inlet = LinkInlet(wire, hello)
    codec = None
    if hello["codec"] is not None:
        from engine.text import TextCodec  # the model's tokenizer files: no vLLM

        codec = TextCodec(*hello["codec"])
    current: list = [Target(inlet, hello["info"], codec)]
    limits = hello["limits"]
    gateway = Gateway(lambda: current[0], limits)
    server = uvicorn.Server(uvicorn.Config(
        gateway.app(Door(hello["token"])), log_level="warning", lifespan="off",
        ws_max_size=4 * limits.max_message_bytes, ws_per_message_deflate=False,
        timeout_graceful_shutdown=hello["graceful_s"]))
    sock = listening_socket(host, port)
    if limits.send_buffer_bytes is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.send_buffer_bytes)
    task = asyncio.create_task(server.serve([sock]))
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"worker could not serve {host}:{port}")
        await asyncio.sleep(0.01)
    wire.send(("ready",))
    try:
        while True:
            for item in await read_items(reader):
                if item[0] == "event":
                    inlet.dispatch(*item[1:])
                elif item[0] == "finished":
                    current[0] = None  # later clients are told no run serves
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    await asyncio.sleep(0.2)  # the last events reach the clients
    server.should_exit = True
    await task


def main(argv: list[str]) -> None:
    # Three positional values from serve (gateway/link.start_workers), no flags for people:
    # argparse stays in cli/.
    link, host, port = argv
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run_worker(link, host, int(port)))


if __name__ == "__main__":
    main(sys.argv[1:])
