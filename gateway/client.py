"""`metronome load`: N concurrent sessions against a realtime server (Metronome's gateway, an
OpenAI-style one or vLLM's /v1/realtime: gateway/client_protocols.py), paced by the wall clock,
recorded as a run (gateway/client_record.py).

Each session connects at its arrival (fixed: all at once; ramp: evenly; Poisson: exponential
gaps), waits for `session.created` (an `error` instead is a rejection), sends what its flavour
opens with (and waits for `session.updated` where the flavour answers one), then one frame of
audio per frame period, as a live microphone would: frame k's append leaves when its last
sample has been "spoken", at start + (k+1)·T. How deltas find their frames is the record's
definition (docs/GATEWAY.md, "What the load client measures").
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import math
import random
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
import websockets

from gateway import client_protocols as dialect
from gateway.client_protocols import DEFAULT_RATE_HZ, PROTOCOLS
from gateway.client_record import ClientRecord
from gateway.speech import session_audio

logger = logging.getLogger(__name__)

CLIENT_LOADS = ("fixed", "ramp", "poisson")
CONNECT_TIMEOUT_S = 5.0  # for the connection, session.created and session.updated each
DRAIN_S = 1.0  # after the last frame: how long its answer may take before it counts missing


@dataclass(frozen=True)
class LoadClientConfig:
    url: str
    sessions: int = 8
    duration_s: float = 10.0
    load: str = "fixed"
    arrival_rate: float | None = None  # ramp, poisson: sessions per second
    wav_dir: str | None = None  # None: synthetic speech
    seed: int = 0
    protocol: str = "auto"  # one of PROTOCOLS; auto: told from the server's first events
    model: str | None = None  # vLLM's session.update names the served model
    # Used only when the server's session.created does not say (another realtime server).
    frame_ms: float = 80.0
    sample_rate_hz: int | None = None  # None: the flavour's (24 kHz OpenAI, 16 kHz vLLM)
    tokens_out: int | None = None  # None: a frame is answered by its first delta
    budget_ms: float | None = None  # None: the frame period
    # A server bound beyond loopback asks for its token (gateway/door.py): sent as the OpenAI
    # SDK sends its api_key; never recorded with the run's settings.
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.url.startswith(("ws://", "wss://")):
            raise ValueError(f"url {self.url!r} is not a ws:// or wss:// address")
        if not 1 <= self.sessions <= 10_000:
            raise ValueError(f"sessions {self.sessions} must be in [1, 10000]")
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= 86_400):
            raise ValueError(f"duration {self.duration_s} s must be in (0, 86400]")
        if self.load not in CLIENT_LOADS:
            raise ValueError(f"load {self.load!r} is not one of {', '.join(CLIENT_LOADS)}")
        if self.load == "poisson" and not self.arrival_rate:
            raise ValueError("load poisson needs --arrival-rate (sessions/s, > 0)")
        if self.arrival_rate is not None and not self.arrival_rate > 0:
            raise ValueError(f"arrival rate {self.arrival_rate} sessions/s must be > 0")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.protocol == "vllm" and not self.model:
            raise ValueError("protocol vllm needs --model: vLLM's session.update must name "
                             "the served model, or it refuses the audio")
        if not 10 <= self.frame_ms <= 1000:
            raise ValueError(f"frame period {self.frame_ms} ms must be in [10, 1000]")
        if self.sample_rate_hz is not None and not 8_000 <= self.sample_rate_hz <= 48_000:
            raise ValueError(f"sample rate {self.sample_rate_hz} Hz must be in [8000, 48000]")
        if self.tokens_out is not None and not 1 <= self.tokens_out <= 4096:
            raise ValueError(f"tokens out {self.tokens_out} must be in [1, 4096]")
        if self.budget_ms is not None and not 1 <= self.budget_ms <= 60_000:
            raise ValueError(f"budget {self.budget_ms} ms must be in [1, 60000]")

    def arrivals(self) -> list[float]:
        if self.load == "fixed":
            return [0.0] * self.sessions
        if self.load == "ramp":
            gap = 1.0 / self.arrival_rate if self.arrival_rate else \
                self.duration_s / 2 / self.sessions
            return [i * gap for i in range(self.sessions) if i * gap < self.duration_s]
        rng, t, out = random.Random(self.seed), 0.0, []
        while len(out) < self.sessions:
            t += rng.expovariate(self.arrival_rate)
            if t >= self.duration_s:
                break
            out.append(t)
        return out

    def likely_rate_hz(self) -> int:
        """The rate a session will most likely be asked (auto: the OpenAI one, which
        Metronome's gateway takes too), so its audio is made before the clock starts."""
        if self.sample_rate_hz is not None:
            return self.sample_rate_hz
        return DEFAULT_RATE_HZ.get(self.protocol, DEFAULT_RATE_HZ["openai"])


def run_load(cfg: LoadClientConfig, store=None) -> dict:
    """Drive the load to its end; record it in `store` when given; returns the summary."""
    started = dt.datetime.now()
    run_id = f"{started:%Y%m%d-%H%M%S}-client-{uuid.uuid4().hex[:6]}"
    rec = ClientRecord(run_id, cfg.url, cfg.budget_ms or cfg.frame_ms, cfg.tokens_out or 1)
    arrivals = cfg.arrivals()
    # Made before the clock starts: synthesising inside the loop would hold every session.
    rate = cfg.likely_rate_hz()
    audio = {(i, rate): session_audio(i, cfg.seed, rate, cfg.wav_dir)
             for i in range(len(arrivals))}
    rec.t0 = time.perf_counter()
    asyncio.run(_drive(cfg, rec, arrivals, audio))
    summary = rec.summary("finished", None, len(arrivals), cfg.duration_s)
    if store is not None:
        settings = {k: v for k, v in asdict(cfg).items() if k != "token"}
        rec.write(store, {**settings, "load": cfg.load}, summary, started)
    return summary


async def _drive(cfg: LoadClientConfig, rec: ClientRecord, arrivals: list[float],
                 audio: dict) -> None:
    await asyncio.gather(*(_session(cfg, rec, i, t, audio) for i, t in enumerate(arrivals)))


class _Heard:
    """What the sender waits for from the receiver."""

    def __init__(self) -> None:
        self.updated = asyncio.Event()  # session.updated, or an error, after session.update
        self.final = asyncio.Event()  # vLLM's transcription.done: its request ended


async def _session(cfg: LoadClientConfig, rec: ClientRecord, sid: int, arrival: float,
                   audio: dict) -> None:
    await asyncio.sleep(max(0.0, arrival - rec.now()))
    try:
        # No compression: zlib on every base64 append was the top of the client's profile.
        ws = await websockets.connect(
            cfg.url, open_timeout=CONNECT_TIMEOUT_S, compression=None, ping_interval=None,
            max_size=8 * 1024 * 1024,
            additional_headers={"Authorization": f"Bearer {cfg.token}"} if cfg.token else None)
    except (OSError, websockets.exceptions.WebSocketException, TimeoutError) as exc:
        rec.event("close", session_id=sid, reason=f"connect failed: {exc}")
        return
    async with ws:
        try:
            first = json.loads(await asyncio.wait_for(ws.recv(), CONNECT_TIMEOUT_S))
            if not isinstance(first, dict):
                raise ValueError(f"first event is not an object: {first!r:.80}")
        except (websockets.exceptions.ConnectionClosed, TimeoutError, ValueError) as exc:
            rec.event("close", session_id=sid, reason=f"no session.created: {exc!r}")
            return
        rec.received(sid, str(first.get("type")))
        if first.get("type") == "error":
            err = dialect.read(first)
            rec.event("reject", session_id=sid, type=err.error_type, code=err.code,
                      message=err.message)
            return
        try:
            terms = dialect.session_terms(first, cfg.protocol, cfg.sample_rate_hz,
                                          cfg.frame_ms, cfg.budget_ms, cfg.tokens_out)
        except (ValueError, TypeError) as exc:  # a session.created this client cannot use
            rec.event("close", session_id=sid, reason=f"unusable session.created: {exc}")
            return
        rec.open(sid, terms)
        samples = audio.get((sid, terms.rate_hz))
        if samples is None:  # another rate: made now, off the loop so no other session waits
            samples = await asyncio.to_thread(session_audio, sid, cfg.seed, terms.rate_hz,
                                              cfg.wav_dir)
        rec.event("open", session_id=sid, server_session=terms.server_session,
                  protocol=terms.protocol, decided_by=terms.decided_by, rate_hz=terms.rate_hz)
        heard = _Heard()
        receiver = asyncio.create_task(_receive(ws, rec, sid, heard))
        try:
            await _open(ws, rec, sid, terms, cfg.model, heard)
            # Every session sends until the load's end, whenever it arrived.
            await _send(ws, rec, sid, samples, terms, cfg.duration_s, receiver, heard)
        except websockets.exceptions.ConnectionClosed:
            pass  # the receiver records the close
        if not receiver.done():
            await asyncio.wait({receiver}, timeout=DRAIN_S + rec.budget_ms / 1e3)
        receiver.cancel()


async def _open(ws, rec: ClientRecord, sid: int, terms, model: str | None,
                heard: _Heard) -> None:
    for event in dialect.opening(terms.protocol, terms.rate_hz, model):
        await ws.send(json.dumps(event))
    if dialect.awaits_update(terms.protocol):
        try:
            await asyncio.wait_for(heard.updated.wait(), CONNECT_TIMEOUT_S)
        except TimeoutError:
            rec.event("error", session_id=sid, code="no_session_updated",
                      message=f"no answer to session.update in {CONNECT_TIMEOUT_S} s")


async def _send(ws, rec: ClientRecord, sid: int, audio: np.ndarray, terms, end_s: float,
                receiver: asyncio.Task, heard: _Heard) -> None:
    n = round(terms.rate_hz * terms.frame_ms / 1e3)
    start = rec.now()
    k = 0
    while not receiver.done():
        due = start + (k + 1) * terms.frame_ms / 1e3  # frame k has been "spoken" by then
        if due > end_s:
            break
        await asyncio.sleep(max(0.0, due - rec.now()))
        chunk = np.take(audio, np.arange(k * n, (k + 1) * n), mode="wrap")
        pcm = (np.clip(chunk, -1.0, 32767 / 32768) * 32768).astype("<i2").tobytes()
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(pcm).decode()}))
        rec.sent(sid, k)
        if k == 0:
            for event in dialect.after_first_append(terms.protocol):
                await ws.send(json.dumps(event))
        k += 1
    for event in dialect.closing(terms.protocol):
        await ws.send(json.dumps(event))
    # Wait for the answers to what was sent (the last frame's truth, or vLLM's end of its
    # request), then leave.
    last = rec.frames.get((sid, k - 1))
    deadline = rec.now() + DRAIN_S + rec.budget_ms / 1e3
    while last is not None and last.done is None and not heard.final.is_set() \
            and rec.now() < deadline and not receiver.done():
        await asyncio.sleep(0.01)


async def _receive(ws, rec: ClientRecord, sid: int, heard: _Heard) -> None:
    try:
        async for message in ws:
            try:
                event = json.loads(message)
            except ValueError:
                event = None
            if not isinstance(event, dict):
                rec.event("error", session_id=sid, code="server_sent_invalid_json")
                continue
            got = dialect.read(event)
            rec.received(sid, got.type)
            if got.kind == "delta":
                rec.delta(sid, got.frame_idx, got.tokens, got.text)
            elif got.kind == "truth":
                rec.done(sid, got.frame_idx, got.truth)
            elif got.kind == "updated":
                heard.updated.set()
            elif got.kind == "final":
                heard.final.set()
            elif got.kind == "error":
                rec.counts[f"error:{got.code}"] += 1
                rec.event("error", session_id=sid, code=got.code, message=got.message)
                heard.updated.set()  # a refused session.update is answered by its error
    except websockets.exceptions.ConnectionClosed as exc:
        rec.event("close", session_id=sid, code=exc.code, reason=exc.reason)
        return
    rec.event("close", session_id=sid, code=ws.close_code, reason=ws.close_reason)
