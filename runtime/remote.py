"""Sessions from outside the process: the inlet between a gateway's connection threads and the
run thread. The runtime knows no sockets; a client is a `listener` (its `deliver(kind, data)`
is called from the run thread and must not block) and a `RemoteFrames` source its connection
fills.

A client's life, as the run thread sees it:
    connect   queued by the connection thread; at the next poll (every `poll_s`, 2 ms) the
              same gate as every arrival answers: `admitted` {session_id} or `rejected`
              {reason} (the run's `reject` event records it, like any arrival's)
    open      as soon as the client's first frame is complete (plus `slack_s`, 0 by
              default): its frames start then, on the client's own grid
    frames    each on the grid when its audio is there; a frame whose audio is late is taken
              the moment it completes (the connection thread marks the client ready, the next
              poll runs the frame), never found by looking again and again
    deltas    pushed as the engine makes them: each remote frame's handle is watched, and
              every token by the frame's deadline goes out at once as `delta` {frame_idx, n,
              token_ids, at} (`at`: the perf_counter time it is due, for a simulated engine
              whose steps run ahead of the wall); the frame's recorded row (its truth) follows
              as `frame` {row}
    close     `closed` {reason}: the client ended, was evicted, or the run ended
Only the run thread touches the engine, the gate and the sessions.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from dataclasses import dataclass, field

from load_gen.remote import RemoteFrames
from load_gen.tokenizer import frame_tokenizer
from runtime.config import RunConfig

logger = logging.getLogger(__name__)

ORIGIN = "gateway"  # frames.origin of a remote client's frames
IDLE_POLL_S = 0.02  # the poll period while no client is connected


@dataclass(frozen=True)
class InletLimits:
    """What one client may cost the run thread."""

    sample_rate_hz: int = 16_000  # the session's PCM16 rate (the tokenizer's)
    max_buffer_s: float = 2.0  # audio a client may be ahead of its frames
    # How often the run thread admits, opens and takes late audio: a poll costs only what
    # happened since the last (the clients that became ready), not a look at every client.
    poll_s: float = 0.002
    # A session's first frame waits this long after its audio is complete. 0: a late frame is
    # taken when its audio completes, so jitter costs only itself, not every frame.
    slack_s: float = 0.0

    def __post_init__(self) -> None:
        if not 8_000 <= self.sample_rate_hz <= 48_000:
            raise ValueError(f"sample rate {self.sample_rate_hz} Hz must be in [8000, 48000]")
        if not (math.isfinite(self.max_buffer_s) and 0.1 <= self.max_buffer_s <= 60):
            raise ValueError(f"max buffered audio {self.max_buffer_s} s must be in [0.1, 60]")
        if not (math.isfinite(self.poll_s) and 0.001 <= self.poll_s <= 0.1):
            raise ValueError(f"poll period {self.poll_s} s must be in [0.001, 0.1]")
        if not (math.isfinite(self.slack_s) and 0 <= self.slack_s <= 1):
            raise ValueError(f"slack {self.slack_s} s must be in [0, 1]")


@dataclass(eq=False)
class Client:
    listener: object
    frames: RemoteFrames
    session_id: int | None = None
    ticket: object = None
    pin: int | None = None
    state: str = "queued"  # queued → admitted → live → closed (or rejected)
    sent: dict = field(default_factory=dict)  # frame_idx → tokens already delivered
    close_reason: str | None = None
    starved: bool = False  # its frame is due and its audio is not there yet
    recorded: int = -1  # the last frame whose row went: its late pushes are not sent
    lock: threading.Lock = field(default_factory=threading.Lock)  # `sent`: engine and run threads


class Inlet:
    """Built before the run (clients buffer audio from their first message); `attach`ed by
    the Runner that serves them."""

    def __init__(self, config: RunConfig, vocab_size: int, limits: InletLimits = InletLimits()):
        self.config = config
        self.limits = limits
        self.tokenizer = frame_tokenizer(limits.sample_rate_hz, config.frame_ms,
                                         config.tokens_in, vocab_size)
        self._queue: collections.deque = collections.deque()  # connection threads → run thread
        self._ready: collections.deque = collections.deque()  # clients whose audio came
        self._clients: dict[int, Client] = {}  # run thread only
        self._next_id = 0
        self.offered = 0
        self.finished = False

    @property
    def poll_s(self) -> float:
        """Until the next poll: `poll_s` while any client is here, else IDLE_POLL_S (a run no
        client joined must not wake its thread 500 times a second; an arrival waits at most
        that long to be admitted)."""
        return self.limits.poll_s if self._clients or self._queue else IDLE_POLL_S

    # --- connection threads ---------------------------------------------------------------
    def connect(self, listener) -> Client:
        client = Client(listener, RemoteFrames(self.tokenizer, self.limits.max_buffer_s))
        client.frames.on_ready = lambda: self._ready.append(client)
        if self.finished:
            client.state = "rejected"
            listener.deliver("rejected", {"reason": "the run has ended"})
        else:
            self._queue.append(client)
        return client

    @staticmethod
    def disconnect(client: Client, reason: str) -> None:
        """The connection is gone or done sending: its frames so far are kept."""
        client.frames.end(reason)

    # --- the run thread -------------------------------------------------------------------
    def attach(self, first_session_id: int) -> None:
        self._next_id = first_session_id

    def poll(self, runner, t_rel: float) -> None:
        while self._queue:
            self._admit(runner, self._queue.popleft(), t_rel)
        wall = time.perf_counter()
        while self._ready:
            client = self._ready.popleft()
            if client.state == "admitted":
                self._maybe_open(runner, client, t_rel, wall)
            elif client.state == "live" and client.starved:
                client.starved = False
                runner.wake(client.session_id, t_rel)

    def _admit(self, runner, client: Client, t_rel: float) -> None:
        sid, self._next_id = self._next_id, self._next_id + 1
        self.offered += 1
        client.session_id = sid
        ticket, client.pin = runner.admit(sid, t_rel, origin=ORIGIN)
        if ticket is None:
            client.state = "rejected"
            client.frames.end("rejected")
            client.listener.deliver("rejected", {"reason": runner.gate.last_rejection})
            return
        client.ticket, client.state = ticket, "admitted"
        self._clients[sid] = client
        client.listener.deliver("admitted", {"session_id": sid})
        self._maybe_open(runner, client, t_rel, time.perf_counter())  # its audio may be here

    def _maybe_open(self, runner, client: Client, t_rel: float, wall: float) -> None:
        frames = client.frames
        if frames.first_full_at is None:
            if frames.end_reason is not None:  # gone before a whole frame: never opened
                runner.gate.release(client.ticket)
                self._close(client, frames.end_reason)
            return  # its ready call comes with the first whole frame
        start = t_rel + max(0.0, self.limits.slack_s - (wall - frames.first_full_at))
        client.state = "live"
        runner.open_remote(client.session_id, client.ticket, start, frames, client.pin)

    def starved(self, session_id: int, t_rel: float) -> float | None:
        """Sessions found a client's frame due before its audio: None, the frame runs when the
        audio comes (at the poll after its ready call), or a time to look again now (it came
        meanwhile)."""
        client = self._clients.get(session_id)
        if client is None:
            return t_rel + self.poll_s
        client.starved = True  # first, so a ready call from now on finds it starved
        if client.frames.backlog() or client.frames.end_reason is not None:
            client.starved = False
            return t_rel
        return None

    def submitted(self, session_id: int, idx: int, handle, runner) -> None:
        """Sessions submitted a client's frame: its tokens are pushed as the engine makes
        them (from the engine's thread; a simulated engine's ahead of time, with `at`)."""
        client = self._clients.get(session_id)
        if client is None:
            return
        deadline = handle.t_submit + self.config.budget / 1e3
        wall_time = runner.engine.wall_time

        def on_tokens(n: int, ids: list[int] | None, t: float) -> None:
            # Only what came by the deadline: a later token answers no frame the speaker
            # still hears, and the recorded row calls the frame silent without it.
            if t > deadline:
                return
            with client.lock:  # one order for this and the row: a row never passes a delta
                if idx <= client.recorded:
                    return  # its row (which counts this token) went already, with the rest
                client.sent[idx] = client.sent.get(idx, 0) + n
                client.listener.deliver("delta", {"frame_idx": idx, "n": n, "token_ids": ids,
                                                  "at": wall_time(t)})

        handle.watch(on_tokens)

    def _close(self, client: Client, reason: str) -> None:
        if client.state == "closed":
            return
        client.state, client.close_reason = "closed", reason
        client.frames.end(reason)
        self._clients.pop(client.session_id, None)
        client.listener.deliver("closed", {"reason": reason})

    # --- observer of the run's rows (run thread) ------------------------------------------
    def observe(self, table: str, row: dict) -> None:
        if table == "frames":
            client = self._clients.get(row["session_id"])
            if client is not None:
                with client.lock:
                    idx, sent = row["frame_idx"], client.sent.pop(row["frame_idx"], 0)
                    client.recorded = max(client.recorded, idx)
                    # Tokens by the deadline whose push had not run yet are still the frame's
                    # (the row counts them): the deltas add up to the row before the row goes.
                    if row["tokens_out"] > sent:
                        ids = row.get("out_ids")
                        client.listener.deliver("delta", {
                            "frame_idx": idx, "n": row["tokens_out"] - sent, "at": None,
                            "token_ids": None if ids is None else ids[sent:row["tokens_out"]]})
                    client.listener.deliver("frame", {"row": row})

    def session_closed(self, session_id: int, why: str) -> None:
        """Sessions closes a remote session (any reason, quiet ones too)."""
        client = self._clients.get(session_id)
        if client is not None:
            self._close(client, why)

    def finish(self, reason: str = "the run has ended") -> None:
        """At the run's end: every client still here is told, and later ones are refused."""
        self.finished = True
        while self._queue:
            client = self._queue.popleft()
            client.state = "rejected"
            client.listener.deliver("rejected", {"reason": reason})
        for client in list(self._clients.values()):
            self._close(client, reason)
