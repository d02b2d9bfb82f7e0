"""Gateway workers in front of one run: the link between the run process and its worker
processes (a Unix socket each), and the run's end of it.

A worker (gateway/worker.py) does a connection's per-frame work in its own process, with its
own event loop and GIL: the WebSocket, JSON and base64, the resampling and the stand-in
tokenizer. What crosses the link is small: a frame's token ids (and its audio only where the
engine takes audio), and back the run's events for the connection (admission, deltas with
their ids, frame rows, the close). The run process keeps what must be one: the run thread, the
engine, the admission gate, the store. Each worker client is an ordinary client of the run's
`Inlet` (runtime/remote.py), whose listener writes to the worker's link instead of a socket.

The wire: length-prefixed pickles (both ends are this program, on one machine), each a list of
items: everything one side had to say since its last write goes in one write.
    worker → run   ("ready",) · ("connect", cid) · ("frames", cid, [(ids, voice, audio)], at)
                   · ("text", cid, ids) · ("clear", cid) · ("commit", cid) · ("end", cid, why)
    run → worker   ("hello", {...}) · ("event", cid, kind, data) · ("finished",)
"""

from __future__ import annotations

import asyncio
import collections
import logging
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from load_gen.frames import Frame

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
ROOT = Path(__file__).resolve().parents[1]
WORKER_START_S = 60.0  # a worker imports numpy, soxr, uvicorn (and the codec): seconds on 2 cores


async def read_items(reader: asyncio.StreamReader) -> list:
    """One message's items; asyncio.IncompleteReadError at the other end's close."""
    (n,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(n))


class Wire:
    """One end's writes, from any thread; items queued together go in one write (one wake-up
    of the event loop pending, however many items)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter) -> None:
        self.loop = loop
        self.writer = writer
        self._items: collections.deque = collections.deque()
        self._signalled = False

    def send(self, item: tuple) -> None:
        self._items.append(item)
        if not self._signalled:
            self._signalled = True
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop is gone: nobody to tell
                pass

    def _flush(self) -> None:
        self._signalled = False
        items = []
        while self._items:
            items.append(self._items.popleft())
        if items and not self.writer.is_closing():
            body = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
            self.writer.write(_LENGTH.pack(len(body)) + body)


class _Listener:
    """A worker client's listener in the run process: its events go down the link."""

    def __init__(self, wire: Wire, cid: int) -> None:
        self.wire, self.cid = wire, cid

    def deliver(self, kind: str, data) -> None:
        self.wire.send(("event", self.cid, kind, data))


class LinkServer:
    """The run's end: a Unix socket the workers connect to. `hello` is what every worker is
    told (the session info, the tokenizer's settings, the codec's files, the limits)."""

    def __init__(self, inlet, hello: dict) -> None:
        self.inlet = inlet
        self.hello = hello
        self.ready = 0  # workers listening on the public port
        self._wires: set[Wire] = set()
        self._server: asyncio.AbstractServer | None = None
        self.folder: str | None = None  # where its socket lives (removed at the end)

    async def start(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._worker, path)

    async def _worker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        wire = Wire(asyncio.get_running_loop(), writer)
        self._wires.add(wire)
        wire.send(("hello", self.hello))
        clients: dict = {}
        try:
            while True:
                for item in await read_items(reader):
                    self._take(item, clients, wire)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._wires.discard(wire)
            for client in clients.values():  # its sessions end; their frames so far stay
                self.inlet.disconnect(client, "gateway worker gone")
            writer.close()

    def _take(self, item: tuple, clients: dict, wire: Wire) -> None:
        kind, cid = item[0], item[1] if len(item) > 1 else None
        if kind == "ready":
            self.ready += 1
            return
        if kind == "connect":
            clients[cid] = self.inlet.connect(_Listener(wire, cid))
            return
        client = clients.get(cid)
        if client is None:
            return  # ended here already
        frames = client.frames
        if kind == "frames":
            frames.push([Frame(ids, 0.0, voice, None if audio is None
                               else np.frombuffer(audio, np.float32))
                         for ids, voice, audio in item[2]], item[3])
        elif kind == "text":
            frames.add_text(item[2])
        elif kind == "clear":
            frames.clear()
        elif kind == "commit":  # the turn: every whole frame so far, taken or buffered
            client.listener.deliver("commit", frames.turn_end())
        elif kind == "end":
            self.inlet.disconnect(clients.pop(cid), item[2])

    def finish(self) -> None:
        """The run has ended: workers stop taking sessions; the link closes."""
        for wire in list(self._wires):  # on the loop: what waits goes first, then the close
            wire.send(("finished",))
            wire._flush()
            wire.writer.close()
        if self._server is not None:
            self._server.close()


async def start_workers(link: LinkServer, n: int, host: str, port: int) -> list:
    """`n` worker processes on host:port, linked to this run; returns once all listen. Each
    is its own session (a terminal's Ctrl-C stops the run here, which ends them)."""
    folder = tempfile.mkdtemp(prefix="metronome-link-")
    link.folder = folder
    await link.start(str(Path(folder) / "link.sock"))
    procs = [subprocess.Popen(
        [sys.executable, "-m", "gateway.worker", str(Path(folder) / "link.sock"), host,
         str(port)], cwd=ROOT, start_new_session=True)
        for _ in range(n)]
    deadline = time.monotonic() + WORKER_START_S
    while link.ready < n:
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{link.ready} of {n} gateway workers started (exit codes "
                               f"{dead}): see their stderr")
        await asyncio.sleep(0.05)
    return procs


async def stop_workers(link: LinkServer, procs: list, wait_s: float) -> None:
    """The run ended: workers are told, tell their clients, and exit; killed after `wait_s`."""
    link.finish()
    deadline = time.monotonic() + wait_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            logger.warning("gateway worker %d did not exit: killed", p.pid)
            p.kill()
            p.wait()
    if link.folder is not None:
        shutil.rmtree(link.folder, ignore_errors=True)
