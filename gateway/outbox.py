"""One connection's outgoing events, bounded: the run thread and the receiver put, the sender
takes and writes to the socket.

A client that stops reading its socket stalls only its own sender (the socket's buffers fill,
then uvicorn's send waits); without a bound, the run thread's deltas and frame rows would pile
up behind it for as long as the session lasts. So at `max_queued_events` unsent events the
connection is given up: what is queued is dropped (counted), the client is told by an `error`
{code slow_reader} and a close 1008 that wait behind what its socket already holds, and every
later event is dropped and counted. The server (gateway/server.py) ends the session then: a
client that cannot take its frames in real time gets nothing from more of them.

Other threads hand events over through one `Courier` per event loop: a thread-safe deque and
at most one wake-up of the loop pending, however many events and connections (a wake-up is a
write to the loop's self-pipe, and each one made the run thread wait for the GIL). The sender
takes what waits in one batch (`batch`), so deltas that came together go out together.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from gateway import protocol

logger = logging.getLogger(__name__)

POLICY = 1008  # the close code of a connection given up (RFC 6455 policy violation)


class Courier:
    """Events from other threads to the outboxes of one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._inbox: collections.deque = collections.deque()
        self._signalled = False

    def send(self, outbox: Outbox, kind: str, data: dict) -> None:
        """Any thread; never blocks. The event is queued before the flag is read and the
        drain clears the flag before it drains, so no event waits for a wake-up never sent."""
        self._inbox.append((outbox, kind, data))
        if not self._signalled:
            self._signalled = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the server's loop is gone: nobody to tell
                pass

    def _drain(self) -> None:
        self._signalled = False
        inbox = self._inbox
        while inbox:
            outbox, kind, data = inbox.popleft()
            outbox.arrive(kind, data)


class Outbox:
    """Built on the server's event loop; `deliver` from any thread, `put` on the loop only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_events: int,
                 courier: Courier | None = None) -> None:
        if max_events < 1:
            raise ValueError(f"max queued events {max_events} must be ≥ 1")
        self.loop = loop
        self.courier = courier or Courier(loop)
        self.max_events = max_events
        self.queue: asyncio.Queue = asyncio.Queue()
        self.overflowed = asyncio.Event()  # set once: the connection is given up
        self.peak = 0  # the most events ever waiting (what the bound holds)
        self.dropped = 0  # events never sent because the client did not read
        self._held: list = []  # (timer, kind, data): deltas whose time has not come

    def deliver(self, kind: str, data: dict) -> None:
        """From the run thread or the engine's (the inlet's listener contract): never blocks.
        A delta with `at` (a perf_counter time still ahead: a simulated engine's token) is
        held until then."""
        self.courier.send(self, kind, data)

    def arrive(self, kind: str, data: dict) -> None:
        at = data.get("at") if kind == "delta" else None
        wait_s = 0.0 if at is None else at - time.perf_counter()
        if wait_s > 0:
            self._held.append((self.loop.call_later(wait_s, self._release), kind, data))
        elif self._held and kind == "delta":  # due, but behind a held one: keep the order
            self._held.append((None, kind, data))
            self._release()
        else:
            self.put(kind, data)

    def _release(self) -> None:
        """A held delta is due: it and every one held before it go (in their order)."""
        now = time.perf_counter()
        while self._held and (self._held[0][2]["at"] or 0) <= now + 1e-4:
            _, kind, data = self._held.pop(0)
            self._put(kind, data)

    def put(self, kind: str, data: dict) -> None:
        if kind != "delta" and self._held:
            # Anything after a frame's deltas (its row, the close) must not pass them: their
            # time has come by then (a row is written after its frame's deadline).
            for timer, held_kind, held_data in self._held:
                if timer is not None:
                    timer.cancel()
                self._put(held_kind, held_data)
            self._held.clear()
        self._put(kind, data)

    def _put(self, kind: str, data: dict) -> None:
        if self.overflowed.is_set():
            self.dropped += 1
            return
        if self.queue.qsize() >= self.max_events:
            self._give_up()
            self.dropped += 1
            return
        self.queue.put_nowait((kind, data))
        self.peak = max(self.peak, self.queue.qsize())

    async def batch(self) -> list[tuple[str, object]]:
        """Everything waiting, at least one event (waits for it)."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        return items

    def _give_up(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()
            self.dropped += 1
        logger.warning("a client left %d events unread: closing its connection",
                       self.max_events)
        self.queue.put_nowait(("error", protocol.error(
            "invalid_request_error", "slow_reader", f"{self.max_events} events were waiting "
            "unread: read the socket as fast as frames come")))
        self.queue.put_nowait(("fatal", {"code": POLICY}))
        self.overflowed.set()

    @property
    def reason(self) -> str:
        """The session's close reason when the connection was given up."""
        return f"slow reader: {self.max_events} events unread"
