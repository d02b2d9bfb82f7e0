"""`metronome load`: N concurrent sessions against any server that speaks the gateway's subset
of the Realtime events, paced by the wall clock, recorded as a run (gateway/client_record.py).

Each session connects at its arrival (fixed: all at once; ramp: evenly; Poisson: exponential
gaps), waits for `session.created` (an `error` instead is a rejection), then sends one frame of
audio per frame period, as a live microphone would: frame k's append leaves when its last
sample has been "spoken", at start + (k+1)·T. Deltas and `response.done` are matched to frames
by `metronome.frame_idx` (or, from a server without it, to the latest frame sent).
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
from dataclasses import asdict, dataclass

import numpy as np
import websockets

from gateway.client_record import ClientRecord
from gateway.speech import session_audio

logger = logging.getLogger(__name__)

CLIENT_LOADS = ("fixed", "ramp", "poisson")
CONNECT_TIMEOUT_S = 5.0
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
    # Used only when the server's session.created does not say (another realtime server).
    frame_ms: float = 80.0
    sample_rate_hz: int = 16_000
    tokens_out: int = 4
    budget_ms: float | None = None

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
        if not 10 <= self.frame_ms <= 1000:
            raise ValueError(f"frame period {self.frame_ms} ms must be in [10, 1000]")

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


def run_load(cfg: LoadClientConfig, store=None) -> dict:
    """Drive the load to its end; record it in `store` when given; returns the summary."""
    started = dt.datetime.now()
    run_id = f"{started:%Y%m%d-%H%M%S}-client-{uuid.uuid4().hex[:6]}"
    rec = ClientRecord(run_id, cfg.url, cfg.budget_ms or cfg.frame_ms, cfg.tokens_out)
    arrivals = cfg.arrivals()
    # Made before the clock starts: synthesising inside the loop would hold every session.
    audio = {i: session_audio(i, cfg.seed, cfg.sample_rate_hz, cfg.wav_dir)
             for i in range(len(arrivals))}
    rec.t0 = time.perf_counter()
    asyncio.run(_drive(cfg, rec, arrivals, audio))
    summary = rec.summary("finished", None, len(arrivals), cfg.duration_s)
    if store is not None:
        rec.write(store, {**asdict(cfg), "load": cfg.load}, summary, started)
    return summary


async def _drive(cfg: LoadClientConfig, rec: ClientRecord, arrivals: list[float],
                 audio: dict) -> None:
    await asyncio.gather(*(_session(cfg, rec, i, t, audio[i]) for i, t in enumerate(arrivals)))


async def _session(cfg: LoadClientConfig, rec: ClientRecord, sid: int, arrival: float,
                   audio: np.ndarray) -> None:
    await asyncio.sleep(max(0.0, arrival - rec.now()))
    try:
        ws = await websockets.connect(cfg.url, open_timeout=CONNECT_TIMEOUT_S,
                                      max_size=8 * 1024 * 1024, ping_interval=None)
    except (OSError, websockets.exceptions.WebSocketException, TimeoutError) as exc:
        rec.event("close", session_id=sid, reason=f"connect failed: {exc}")
        return
    async with ws:
        try:
            first = json.loads(await asyncio.wait_for(ws.recv(), CONNECT_TIMEOUT_S))
        except (websockets.exceptions.ConnectionClosed, TimeoutError, ValueError) as exc:
            rec.event("close", session_id=sid, reason=f"no session.created: {exc!r}")
            return
        if first.get("type") == "error":
            err = first.get("error", {})
            rec.event("reject", session_id=sid, type=err.get("type"), code=err.get("code"),
                      message=err.get("message"))
            return
        info = (first.get("session") or {}).get("metronome") or {}
        rate = info.get("sample_rate_hz", cfg.sample_rate_hz)
        if rate != cfg.sample_rate_hz:  # the server asks another rate: make it now
            audio = session_audio(sid, cfg.seed, rate, cfg.wav_dir)
        frame_ms = info.get("frame_ms", cfg.frame_ms)
        rec.budget_ms = info.get("budget_ms", rec.budget_ms)
        rec.tokens_expected = info.get("tokens_out", rec.tokens_expected)
        rec.event("open", session_id=sid, server_session=info.get("session_id"))
        receiver = asyncio.create_task(_receive(ws, rec, sid))
        # Every session sends until the load's end, whenever it arrived.
        await _send(ws, rec, sid, audio, rate, frame_ms, cfg.duration_s, receiver)
        if not receiver.done():
            await asyncio.wait({receiver}, timeout=DRAIN_S + rec.budget_ms / 1e3)
        receiver.cancel()


async def _send(ws, rec: ClientRecord, sid: int, audio: np.ndarray, rate: int,
                frame_ms: float, end_s: float, receiver: asyncio.Task) -> None:
    n = round(rate * frame_ms / 1e3)
    start = rec.now()
    k = 0
    while not receiver.done():
        due = start + (k + 1) * frame_ms / 1e3  # frame k has been "spoken" by then
        if due > end_s:
            break
        await asyncio.sleep(max(0.0, due - rec.now()))
        chunk = np.take(audio, np.arange(k * n, (k + 1) * n), mode="wrap")
        pcm = (np.clip(chunk, -1.0, 32767 / 32768) * 32768).astype("<i2").tobytes()
        try:
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm).decode()}))
        except websockets.exceptions.ConnectionClosed:
            break
        rec.sent(sid, k)
        k += 1
    # Wait for the answers to what was sent (the receiver marks done frames), then leave.
    last = (sid, k - 1)
    deadline = rec.now() + DRAIN_S + rec.budget_ms / 1e3
    while k and rec.frames[last].done is None and rec.now() < deadline and not receiver.done():
        await asyncio.sleep(0.01)


async def _receive(ws, rec: ClientRecord, sid: int) -> None:
    try:
        async for message in ws:
            try:
                event = json.loads(message)
            except ValueError:
                rec.event("error", session_id=sid, code="server_sent_invalid_json")
                continue
            kind = event.get("type")
            meta = event.get("metronome") or {}
            if kind in ("response.text.delta", "response.output_text.delta",
                        "response.audio_transcript.delta"):
                rec.delta(sid, meta.get("frame_idx"), meta.get("tokens", 1))
            elif kind == "response.done":
                truth = (event.get("response") or {}).get("metronome") or {}
                rec.done(sid, truth.get("frame_idx"), truth)
            elif kind == "error":
                err = event.get("error", {})
                rec.counts[f"error:{err.get('code')}"] += 1
                rec.event("error", session_id=sid, code=err.get("code"),
                          message=err.get("message"))
    except websockets.exceptions.ConnectionClosed as exc:
        rec.event("close", session_id=sid, code=exc.code, reason=exc.reason)
        return
    rec.event("close", session_id=sid, code=ws.close_code, reason=ws.close_reason)
