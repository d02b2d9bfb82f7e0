"""The OpenAI Realtime events the gateway speaks (docs/GATEWAY.md has the table), and its limits.

Two dialects by their event names: GA (what the official SDK and the OpenAI docs speak now,
the default) and beta (`response.text.delta`, `conversation.item.created`, the beta session
object), chosen per connection: the beta header (`OpenAI-Beta: realtime=v1`), `?dialect=beta`,
or a `session.update` in the beta shape. Client events are the same names in both.
Metronome's own fields sit under a `metronome` key and in `metronome.frame` events, which
other clients ignore.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import json
import math
from dataclasses import dataclass

CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear", "response.create", "response.cancel",
                 "conversation.item.create")
DIALECTS = ("ga", "beta")
# Server event names that differ between the dialects.
NAMES = {"ga": {"text_delta": "response.output_text.delta",
                "text_done": "response.output_text.done", "item_added": "conversation.item.added",
                "content": "output_text"},
         "beta": {"text_delta": "response.text.delta", "text_done": "response.text.done",
                  "item_added": "conversation.item.created", "content": "text"}}
_ids = itertools.count(1)


@dataclass(frozen=True)
class GatewayLimits:
    """What one connection may cost; misuse gets an `error` event (and, where it repeats or
    cannot be served, a close)."""

    max_message_bytes: int = 256 * 1024  # ~2.7 s of 24 kHz PCM16 in base64
    max_messages_per_s: int = 200  # 20 ms appends are 50/s
    max_protocol_errors: int = 10  # malformed events before the connection is closed
    idle_timeout_s: float = 10.0  # no message for this long: closed
    # Events waiting for a client that does not read (gateway/outbox.py); at 80 ms frames a
    # session gets ≤ 5 a frame (4 deltas and a frame row), ~62/s: 512 is ~8 s, ~200 KB.
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


@dataclass(frozen=True)
class SessionSettings:
    """What a client set with `session.update` (and what `session.updated` echoes)."""

    rate_hz: int = 24_000  # the Realtime API's PCM rate; 16 kHz and others are resampled
    dialect: str = "ga"
    instructions: str = ""
    voice: str | None = None

    def __post_init__(self) -> None:
        if not 8_000 <= self.rate_hz <= 48_000:
            raise ValueError(f"input rate {self.rate_hz} Hz must be in [8000, 48000]")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect {self.dialect!r} is not one of {', '.join(DIALECTS)}")


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


def _refuse(field_name: str, value, why: str) -> ProtocolError:
    return ProtocolError("unsupported_value", f"session.{field_name} = {value!r:.60}: {why}")


def updated(event: dict, now: SessionSettings) -> SessionSettings:
    """The settings after a `session.update` (GA or beta shape); only what contradicts the
    run is refused, naming the field."""
    session = event.get("session", {})
    if not isinstance(session, dict):
        raise ProtocolError("invalid_event", "session.update needs a `session` object")
    kind = session.get("type")
    if kind is not None and kind != "realtime":
        raise _refuse("type", kind, "this gateway serves realtime sessions (a frame-synchronous"
                                    " model), not transcription")
    beta = kind is None and ("modalities" in session or "input_audio_format" in session)
    modalities = session.get("output_modalities", session.get("modalities"))
    if modalities is not None:
        if not isinstance(modalities, list) or not modalities:
            raise _refuse("output_modalities", modalities, "a list such as [\"text\"]")
        if any(m != "text" for m in modalities):
            raise _refuse("output_modalities", modalities, "this model has no audio output; "
                                                           "only [\"text\"] is served")
    rate = now.rate_hz
    fmt = session.get("input_audio_format")
    if fmt is not None:  # beta: pcm16 is 24 kHz
        if fmt != "pcm16":
            raise _refuse("input_audio_format", fmt, "only pcm16 is served")
        rate = 24_000
    audio_in = ((session.get("audio") or {}).get("input") or {}).get("format")
    if audio_in is not None:
        if not isinstance(audio_in, dict) or audio_in.get("type", "audio/pcm") != "audio/pcm":
            raise _refuse("audio.input.format.type", (audio_in or {}).get("type")
                          if isinstance(audio_in, dict) else audio_in, "only audio/pcm is served")
        rate = audio_in.get("rate", 24_000)
        if not isinstance(rate, int) or isinstance(rate, bool) or not 8_000 <= rate <= 48_000:
            raise _refuse("audio.input.format.rate", rate, "a PCM rate in [8000, 48000] Hz "
                                                           "(24000 or 16000)")
    instructions = session.get("instructions", now.instructions)
    if not isinstance(instructions, str):
        raise _refuse("instructions", instructions, "text")
    voice = session.get("voice", ((session.get("audio") or {}).get("output") or {}).get("voice",
                                                                                       now.voice))
    return dataclasses.replace(now, rate_hz=rate, dialect="beta" if beta else now.dialect,
                               instructions=instructions,
                               voice=voice if isinstance(voice, str) else now.voice)


def session_object(base: dict, settings: SessionSettings) -> dict:
    """The session as `session.created` / `session.updated` show it, in the dialect's shape;
    `metronome.sample_rate_hz` is the rate the client sends at."""
    meta = {**base["metronome"], "sample_rate_hz": settings.rate_hz,
            "frame_samples": round(base["metronome"]["frame_ms"] * settings.rate_hz / 1e3),
            "dialect": settings.dialect}
    common = {"id": base["id"], "object": "realtime.session", "model": base["model"],
              "instructions": settings.instructions, "metronome": meta}
    if settings.dialect == "beta":
        return {**common, "modalities": ["text"], "input_audio_format": "pcm16",
                "voice": settings.voice, "turn_detection": None}
    return {**common, "type": "realtime", "output_modalities": ["text"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": settings.rate_hz},
                                "turn_detection": None},
                      "output": {"voice": settings.voice}}}


def text_item(event: dict) -> str:
    """The text of a `conversation.item.create` (a user message of input_text parts)."""
    item = event.get("item")
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        raise ProtocolError("unsupported_item", "conversation.item.create takes a message item "
                                                "(item.type message)")
    parts = item.get("content")
    if not isinstance(parts, list) or not parts:
        raise ProtocolError("unsupported_item", "item.content must be a list of input_text "
                                                "parts")
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "text") \
                or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else part
            raise ProtocolError("unsupported_item", f"item.content part {kind!r:.40}: only "
                                                    "input_text parts are fed (audio comes "
                                                    "through input_audio_buffer.append)")
        texts.append(part["text"])
    return "".join(texts)


def event(kind: str, **fields) -> dict:
    return {"type": kind, "event_id": event_id(), **fields}


def error(kind: str, code: str, message: str) -> dict:
    return event("error", error={"type": kind, "code": code, "message": message})


# The recorded row's fields a client sees in `metronome.frame` (its truth on the server).
FRAME_FIELDS = ("session_id", "frame_idx", "t_submit", "deadline", "latency_ms",
                "latency_bound_ms", "censored", "tokens_out", "tokens_expected", "on_time",
                "silent", "skipped", "complete", "silent_cause", "out_ids")


def frame_event(row: dict, response_id: str | None) -> dict:
    """One frame's truth, as the server recorded it (an SDK client ignores the event)."""
    return event("metronome.frame", response_id=response_id,
                 frame={k: row.get(k) for k in FRAME_FIELDS})
