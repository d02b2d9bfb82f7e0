"""The WebSocket endpoint `/v1/realtime`: one connection is one session of the current run.

Each connection runs two tasks on the server's event loop: the receiver (client events →
the run's inlet: audio into the session's buffer, text items as tokens, commits and cancels
queued for the sender; malformed events answered with `error`) and the sender (what the run
delivers and the client asked, in order → server events, framed as responses by
gateway/responses.py, words decoded as they come). Both end the connection cleanly:
a client that disconnects, sends garbage too often, floods, or runs ahead of real time ends
only its own session; the run and the other sessions go on. Errors and the close go through
the sender's queue (gateway/outbox.py, bounded: a client that stops reading is closed, not
buffered for), so one task writes to the socket. Beside it: `/healthz` (which run
serves) and `/mic`, the operator's microphone page (gateway/mic.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway import client_events, mic, protocol
from gateway.client_events import Connection
from gateway.door import Door, TokenMiddleware
from gateway.outbox import Courier, Outbox
from gateway.protocol import GatewayLimits, ProtocolError, SessionSettings
from gateway.responses import Responses
from load_gen.remote import BufferFull

logger = logging.getLogger(__name__)

ADMISSION_WAIT_S = 5.0  # the run thread answers within a poll; this bounds a stuck run
FLUSH_WAIT_S = 1.0  # time the sender gets to deliver a last error before the close
# A client that stopped reading takes its slow_reader error only once it reads again: it gets
# this long (its memory is bounded meanwhile), then the connection is dropped unannounced.
SLOW_CLOSE_WAIT_S = 10.0
# Close codes (RFC 6455): normal, going away, policy violation, too big, try again later.
NORMAL, GOING_AWAY, POLICY, TOO_BIG, TRY_LATER = 1000, 1001, 1008, 1009, 1013


@dataclass(frozen=True)
class Target:
    """The run serving sessions now: its inlet, what every session of it is told
    (gateway/serve.session_info) and the model's words (engine.text.TextCodec, or None:
    counts only)."""

    inlet: object
    info: dict
    codec: object = None


class Gateway:
    """`current()` → the Target serving sessions now, or None (no run: a client is told)."""

    def __init__(self, current, limits: GatewayLimits = GatewayLimits(),
                 no_run: str = "no run is serving sessions now") -> None:
        self.current = current
        self.limits = limits
        self.no_run = no_run  # what a client is told when nothing runs
        self.connections = 0
        self.slow_readers = 0  # connections given up because their client did not read
        self._peak_closed = 0  # the most events ever waiting for a connection now closed
        self._outboxes: set[Outbox] = set()
        self._courier: Courier | None = None  # the event loop's, made at its first connection

    def routes(self) -> list:
        """What an app mounts (the console's st.App could take these too)."""
        return [WebSocketRoute("/v1/realtime", self.realtime), Route("/healthz", self._health),
                *mic.routes()]

    def app(self, door: Door = Door(), extra: tuple = ()) -> Starlette:
        """The gateway's own server (`metronome serve`), with `extra` routes, behind `door`."""
        return Starlette(routes=[*self.routes(), *extra],
                         middleware=[Middleware(TokenMiddleware, door=door)])

    def queue_peak(self) -> int:
        """The most events ever waiting for one connection, open or closed."""
        return max([self._peak_closed, *(box.peak for box in self._outboxes)])

    async def _health(self, _request):
        target = self.current()
        return JSONResponse({"run": None if target is None else target.info["run_id"],
                             "connections": self.connections, "slow_readers": self.slow_readers,
                             "queue_peak_events": self.queue_peak(),
                             "max_queued_events": self.limits.max_queued_events})

    async def realtime(self, ws: WebSocket) -> None:
        await ws.accept()
        target = self.current()
        if target is None:
            await self._refuse(ws, "server_error", "no_run", self.no_run)
            return
        inlet, info, codec = target.inlet, target.info, target.codec
        loop = asyncio.get_running_loop()
        if self._courier is None or self._courier.loop is not loop:
            self._courier = Courier(loop)
        listener = Outbox(loop, self.limits.max_queued_events, self._courier)
        client = inlet.connect(listener)
        try:
            kind, data = await asyncio.wait_for(listener.queue.get(), ADMISSION_WAIT_S)
        except TimeoutError:
            inlet.disconnect(client, "admission timed out")
            await self._refuse(ws, "server_error", "admission_timeout", "the run did not "
                               f"answer within {ADMISSION_WAIT_S:g} s")
            return
        if kind == "rejected":
            await self._refuse(ws, "server_overloaded", "server_overloaded",
                               f"session refused: {data['reason']}")
            return
        sid = data["session_id"]
        base = {**info, "metronome": {**info["metronome"], "session_id": sid},
                "id": f"sess_{info['run_id']}_{sid}"}
        settings = SessionSettings(dialect=client_events.dialect(ws.headers, ws.query_params))
        client.frames.set_rate(settings.rate_hz)  # what session.created says it takes
        state = Connection(base, settings, Responses(
            f"{info['run_id']}_{sid}", codec.stream() if codec else None,
            settings.dialect))
        self.connections += 1
        self._outboxes.add(listener)
        try:
            await ws.send_text(json.dumps(protocol.event(
                "session.created", session=protocol.session_object(base, settings))))
            await self._serve(ws, inlet, client, listener, state, codec)
        finally:
            self.connections -= 1
            self._outboxes.discard(listener)
            self._peak_closed = max(self._peak_closed, listener.peak)
            if listener.dropped:
                logger.warning("session %s: %d events dropped unread", sid, listener.dropped)

    async def _serve(self, ws, inlet, client, listener: Outbox, state, codec) -> None:
        receiver = asyncio.create_task(self._receive(ws, client, listener, state, codec))
        sender = asyncio.create_task(self._send(ws, listener, state.responses))
        overflow = asyncio.create_task(listener.overflowed.wait())
        done, _ = await asyncio.wait({receiver, sender, overflow},
                                     return_when=asyncio.FIRST_COMPLETED)
        overflow.cancel()
        if listener.overflowed.is_set():  # the client does not read: its session ends now
            self.slow_readers += 1
            receiver.cancel()
            inlet.disconnect(client, listener.reason)
            # The error and close wait behind what the socket holds; a client that never
            # reads again never takes them, so the sender gets a bounded time, then goes.
            await _bounded(sender, SLOW_CLOSE_WAIT_S)
        elif receiver in done:
            reason = receiver.result()
            inlet.disconnect(client, reason)
            if reason == "client disconnected":
                sender.cancel()
            else:  # our error and close are queued: let the sender deliver them
                await _bounded(sender, FLUSH_WAIT_S)
        else:
            receiver.cancel()
            inlet.disconnect(client, "closed by the server")
        # A close frame waits for room in the socket like any send: bounded for the same
        # reason; uvicorn closes the transport when this handler returns.
        await _bounded(asyncio.ensure_future(_close(ws, NORMAL)), FLUSH_WAIT_S)

    async def _receive(self, ws: WebSocket, client, listener, state, codec) -> str:
        """Until the client leaves or must go; returns why (the session's close reason)."""
        limits = self.limits
        window, count, errors = time.monotonic(), 0, 0

        def fatal(code: str, message: str, close_code: int) -> str:
            listener.put("error", protocol.error("invalid_request_error", code, message))
            listener.put("fatal", {"code": close_code})
            return message

        while True:
            try:
                msg = await asyncio.wait_for(ws.receive(), limits.idle_timeout_s)
            except TimeoutError:
                return fatal("idle_timeout", f"no message for {limits.idle_timeout_s:g} s",
                             POLICY)
            except WebSocketDisconnect:
                return "client disconnected"
            if msg["type"] == "websocket.disconnect":
                return "client disconnected"
            now = time.monotonic()
            if now - window >= 1.0:
                window, count = now, 0
            count += 1
            if count > limits.max_messages_per_s:
                return fatal("rate_limited", f"more than {limits.max_messages_per_s} "
                                             "messages in one second", POLICY)
            text = msg.get("text")
            size = len(text.encode()) if text is not None else len(msg.get("bytes") or b"")
            if size > limits.max_message_bytes:
                return fatal("message_too_large", f"message of {size} bytes is above the "
                             f"{limits.max_message_bytes} allowed", TOO_BIG)
            try:
                if text is None:
                    raise ProtocolError("invalid_event", "binary messages are not events; "
                                                         "send JSON text")
                replies = client_events.handle(protocol.parse(text), client.frames, state,
                                               codec)
            except BufferFull as exc:
                return fatal("input_audio_buffer_overflow", str(exc), POLICY)
            except ProtocolError as exc:
                errors += 1
                listener.put("error", protocol.error("invalid_request_error", exc.code,
                                                     str(exc)))
                if errors >= limits.max_protocol_errors:
                    return fatal("too_many_errors", f"{errors} malformed events", POLICY)
                continue
            for kind, data in replies:
                listener.put(kind, data)

    @staticmethod
    async def _send(ws: WebSocket, listener: Outbox, responses: Responses) -> None:
        while True:
            for kind, data in _merged(await listener.batch()):
                if kind == "fatal":
                    await _close(ws, data["code"])
                    return
                if kind == "closed":  # by the run: evicted, or the run ended
                    for event in responses.closed():
                        await _send_text(ws, event)
                    await _send_text(ws, protocol.error("server_error", "session_closed",
                                                        f"session closed: {data['reason']}"))
                    return
                if kind == "dialect":
                    responses.dialect = data
                    continue
                events = (responses.delta(data["frame_idx"], data["n"], data["token_ids"])
                          if kind == "delta" else responses.frame(data["row"]) if kind == "frame"
                          else responses.commit(data) if kind == "commit"
                          else responses.cancel() if kind == "cancel" else [data])
                for event in events:
                    if not await _send_text(ws, event):
                        return

    @staticmethod
    async def _refuse(ws: WebSocket, kind: str, code: str, message: str) -> None:
        await _send_text(ws, protocol.error(kind, code, message))
        await _close(ws, TRY_LATER)


def _merged(items: list) -> list:
    """Deltas of one frame that waited together go as one (their tokens in order)."""
    out: list = []
    for kind, data in items:
        if kind == "delta" and out and out[-1][0] == "delta" \
                and out[-1][1]["frame_idx"] == data["frame_idx"]:
            last = out[-1][1]
            ids = None if last["token_ids"] is None or data["token_ids"] is None \
                else last["token_ids"] + data["token_ids"]
            out[-1] = (kind, {**last, "n": last["n"] + data["n"], "token_ids": ids})
        else:
            out.append((kind, data))
    return out


async def _bounded(task: asyncio.Future, timeout_s: float) -> None:
    """Wait for `task` up to `timeout_s`, then cancel it (a send stuck on a full socket)."""
    try:
        await asyncio.wait_for(task, timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        pass


async def _send_text(ws: WebSocket, event: dict) -> bool:
    try:
        await ws.send_text(json.dumps(event, default=str))
        return True
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False  # the client is gone


async def _close(ws: WebSocket, code: int) -> None:
    try:
        await ws.close(code)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass  # already closed
