"""The subset of the OpenAI Realtime events the gateway speaks (docs/GATEWAY.md), and its limits.

Client → server: `session.update`, `input_audio_buffer.append` (base64 PCM16 at the session's
rate), `input_audio_buffer.commit` (acknowledged; frames are cut by the clock, not by commits).
Server → client: `session.created`, `session.updated`, `input_audio_buffer.committed`,
`response.text.delta` (a frame's tokens as they come), `response.done` (a frame's recorded
truth; an empty frame is a done with `silent: true` and no delta before it), `error`.
Metronome's per-frame fields sit under a `metronome` key, which other clients ignore.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
from dataclasses import dataclass

CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit")
_ids = itertools.count(1)


@dataclass(frozen=True)
class GatewayLimits:
    """What one connection may cost; misuse gets an `error` event (and, where it repeats or
    cannot be served, a close)."""

    max_message_bytes: int = 256 * 1024  # ~3 s of 16 kHz PCM16 in base64
    max_messages_per_s: int = 200  # 80 ms appends are 12.5/s
    max_protocol_errors: int = 10  # malformed events before the connection is closed
    idle_timeout_s: float = 10.0  # no message for this long: closed
    # Events waiting for a client that does not read (gateway/outbox.py); at 80 ms frames a
    # session gets ≤ 5 a frame (4 deltas and a done), ~62/s: 512 is ~8 s, ~200 KB.
    max_queued_events: int = 512
    # The kernel's send buffer per connection (SO_SNDBUF; Linux doubles it). None: the kernel
    # tunes it, up to net.ipv4.tcp_wmem's max (4 MiB here): that much output for a client that
    # does not read sits in the kernel before the queue above starts to fill.
    send_buffer_bytes: int | None = None

    def __post_init__(self) -> None:
        if not 1024 <= self.max_message_bytes <= 16 * 1024 * 1024:
            raise ValueError(f"max message {self.max_message_bytes} bytes must be in "
                             "[1024, 16777216]")
        if not 1 <= self.max_messages_per_s <= 10_000:
            raise ValueError(f"max messages {self.max_messages_per_s}/s must be in [1, 10000]")
        if not 1 <= self.max_protocol_errors <= 1000:
            raise ValueError(f"max protocol errors {self.max_protocol_errors} must be in "
                             "[1, 1000]")
        if not (math.isfinite(self.idle_timeout_s) and 0.5 <= self.idle_timeout_s <= 3600):
            raise ValueError(f"idle timeout {self.idle_timeout_s} s must be in [0.5, 3600]")
        if self.send_buffer_bytes is not None and not \
                4096 <= self.send_buffer_bytes <= 16 * 1024 * 1024:
            raise ValueError(f"send buffer {self.send_buffer_bytes} bytes must be in "
                             "[4096, 16777216] (or None: the kernel's choice)")
        if not 16 <= self.max_queued_events <= 100_000:
            raise ValueError(f"max queued events {self.max_queued_events} must be in "
                             "[16, 100000]")


class ProtocolError(ValueError):
    """A client event the gateway cannot take; `code` names it in the error event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def event_id() -> str:
    return f"event_{next(_ids)}"


def parse(text: str) -> dict:
    """One client message → its event (a dict with a known `type`), or ProtocolError."""
    try:
        event = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ProtocolError("invalid_json", "the message is not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ProtocolError("invalid_event", "an event is a JSON object with a string `type`")
    if event["type"] not in CLIENT_EVENTS:
        raise ProtocolError("unknown_event", f"event type {event['type']!r:.60} is not one of "
                                             f"{', '.join(CLIENT_EVENTS)}")
    return event


def audio_bytes(event: dict) -> bytes:
    """The PCM16 bytes of an `input_audio_buffer.append`."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise ProtocolError("invalid_audio", "input_audio_buffer.append needs `audio`: base64 "
                                             "PCM16")
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_audio", "`audio` is not valid base64") from None
    if len(data) % 2:
        raise ProtocolError("invalid_audio", f"PCM16 audio of {len(data)} bytes is not a whole "
                                             "number of 16-bit samples")
    return data


def check_session_update(event: dict, rate_hz: int) -> None:
    """Only what the session already is may be asked: pcm16 at its rate."""
    session = event.get("session", {})
    if not isinstance(session, dict):
        raise ProtocolError("invalid_event", "session.update needs a `session` object")
    fmt = session.get("input_audio_format", "pcm16")
    if fmt != "pcm16":
        raise ProtocolError("unsupported_format", f"input_audio_format {fmt!r:.40}: only "
                                                  "pcm16 is served")
    rate = (((session.get("audio") or {}).get("input") or {}).get("format") or {}).get("rate")
    if rate is not None and rate != rate_hz:
        raise ProtocolError("unsupported_rate", f"input rate {rate!r:.20} Hz: this session "
                                                f"takes {rate_hz} Hz")


def error(kind: str, code: str, message: str) -> dict:
    return {"type": "error", "event_id": event_id(),
            "error": {"type": kind, "code": code, "message": message}}


def session_created(info: dict) -> dict:
    return {"type": "session.created", "event_id": event_id(), "session": info}


def delta(frame_idx: int, n: int, token_ids: list[int] | None) -> dict:
    # Backends do not report output ids yet: a placeholder per token keeps the count.
    text = " ".join(map(str, token_ids)) if token_ids else " ".join("·" * n)
    return {"type": "response.text.delta", "event_id": event_id(),
            "response_id": f"frame_{frame_idx}", "item_id": f"frame_{frame_idx}",
            "output_index": 0, "content_index": 0, "delta": text,
            "metronome": {"frame_idx": frame_idx, "tokens": n, "token_ids": token_ids}}


# The recorded row's fields a client sees in `response.done` (its truth on the server).
DONE_FIELDS = ("session_id", "frame_idx", "t_submit", "deadline", "latency_ms",
               "latency_bound_ms", "censored", "tokens_out", "tokens_expected", "on_time",
               "silent", "skipped", "complete", "silent_cause")


def frame_done(row: dict) -> dict:
    idx = row["frame_idx"]
    return {"type": "response.done", "event_id": event_id(),
            "response": {"id": f"frame_{idx}", "object": "realtime.response",
                         "status": "incomplete" if row["silent"] else "completed",
                         "output": [], "metronome": {k: row.get(k) for k in DONE_FIELDS}}}
