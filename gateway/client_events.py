"""A connection's client events → what the sender sends, in order (gateway/server.py's
receiver calls `handle`; audio and text reach the run's frame source at once, commits and
cancels are queued behind what the run already delivered)."""

from __future__ import annotations

from gateway import protocol
from gateway.protocol import ProtocolError, SessionSettings
from gateway.responses import Responses
from load_gen.remote import pcm16_to_float


class Connection:
    """One connection's settings and responses (the event loop's; receiver and sender)."""

    def __init__(self, base: dict, settings: SessionSettings, responses: Responses) -> None:
        self.base = base
        self.settings = settings
        self.responses = responses


def dialect(headers, query) -> str:
    """Beta where the client says so: the beta SDKs' header, or `?dialect=beta`."""
    beta = "realtime=v1" in headers.get("openai-beta", "") or query.get("dialect") == "beta"
    return "beta" if beta else "ga"


def handle(event: dict, frames, state: Connection, codec) -> list[tuple[str, object]]:
    """One client event → what goes to the sender's queue, in order."""
    kind = event["type"]
    if kind == "input_audio_buffer.append":
        frames.append(pcm16_to_float(protocol.audio_bytes(event)))
        return []
    if kind == "session.update":
        settings = protocol.updated(event, state.settings)
        try:
            frames.set_rate(settings.rate_hz)
        except ValueError as exc:
            raise ProtocolError("unsupported_value", str(exc)) from None
        state.settings = settings
        return [("dialect", settings.dialect),
                ("event", protocol.event("session.updated", session=protocol.session_object(
                    state.base, settings)))]
    if kind == "input_audio_buffer.commit":
        # The turn is every whole frame so far (taken or buffered); a partial frame
        # belongs to the next one. None: the run answers it (a gateway worker's frames).
        idx = frames.turn_end()
        return [] if idx is None else [("commit", idx)]
    if kind == "input_audio_buffer.clear":
        frames.clear()
        return [("event", protocol.event("input_audio_buffer.cleared"))]
    if kind == "response.cancel":
        return [("cancel", None)]
    if kind == "response.create":
        return []  # answered by the open response, or the next frame opens one
    return _text_item(event, frames, state, codec)  # conversation.item.create


def _text_item(event: dict, frames, state: Connection, codec) -> list[tuple[str, object]]:
    text = protocol.text_item(event)
    if codec is None:
        raise ProtocolError("unsupported_item", "this run's engine has no tokenizer: text "
                                                "items cannot be fed")
    ids = codec.encode(text)
    frames.add_text(ids)
    item = {**event["item"], "id": event["item"].get("id") or f"item_{protocol.event_id()}",
            "object": "realtime.item", "status": "completed"}
    names = protocol.NAMES[state.settings.dialect]
    added = protocol.event(names["item_added"], previous_item_id=None, item=item,
                           metronome={"tokens": len(ids)})
    if state.settings.dialect == "beta":
        return [("event", added)]
    return [("event", added), ("event", protocol.event("conversation.item.done", item=item))]
