"""The load client's dialects of realtime: what it sends and how it reads each server event, per
flavour (docs/GATEWAY.md, "What the load client measures").

    openai       the GA Realtime events; what Metronome's gateway speaks (`metronome.frame`)
    openai-beta  the beta names (`response.text.delta`, `modalities`, `input_audio_format`)
    vllm         vLLM's own /v1/realtime transcription (`transcription.delta`, per segment)

`auto` tells them apart from `session.created`, or failing that from the first delta. Reading
does not depend on the flavour: every delta name is read as a delta, so a server that mixes
them is measured all the same (and the mismatch counted); the flavour decides only what the
client sends and the audio rate it assumes where the server does not say.
"""

from __future__ import annotations

from dataclasses import dataclass

PROTOCOLS = ("auto", "openai", "openai-beta", "vllm")
FLAVOURS = PROTOCOLS[1:]
# The input rate each flavour takes when the session does not say: OpenAI's pcm16 is 24 kHz;
# vLLM hands the samples to the model as they are, and its realtime models hear 16 kHz.
DEFAULT_RATE_HZ = {"openai": 24_000, "openai-beta": 24_000, "vllm": 16_000}
# Delta events → the flavour they belong to (the transcript names carry text as well).
DELTA_EVENTS = {"response.output_text.delta": "openai",
                "response.output_audio_transcript.delta": "openai",
                "response.text.delta": "openai-beta",
                "response.audio_transcript.delta": "openai-beta",
                "transcription.delta": "vllm"}
FRAME_TRUTH = "metronome.frame"  # Metronome's per-frame record (GA gateway)
FINAL = "transcription.done"  # vLLM: the streaming request ended (after the final commit)


@dataclass(frozen=True)
class SessionTerms:
    """What a `session.created` says about the session, and what the client assumes where it
    says nothing (the `metronome` part is Metronome's; other servers send none)."""

    protocol: str | None  # None: undecided (the first delta may still tell)
    decided_by: str  # "flag", "session.created" or "undecided"
    rate_hz: int
    frame_ms: float
    budget_ms: float
    tokens_out: int
    per_frame: bool  # the server marks each delta with its frame (metronome.frame_idx)
    server_session: object = None

    def __post_init__(self) -> None:
        if self.protocol is not None and self.protocol not in FLAVOURS:
            raise ValueError(f"protocol {self.protocol!r} is not one of {', '.join(FLAVOURS)}")
        if not 8_000 <= self.rate_hz <= 48_000:
            raise ValueError(f"sample rate {self.rate_hz} Hz must be in [8000, 48000]")
        if not 10 <= self.frame_ms <= 1000:
            raise ValueError(f"frame period {self.frame_ms} ms must be in [10, 1000]")
        if not 1 <= self.budget_ms <= 60_000:
            raise ValueError(f"budget {self.budget_ms} ms must be in [1, 60000]")
        if not 1 <= self.tokens_out <= 4096:
            raise ValueError(f"tokens out {self.tokens_out} must be in [1, 4096]")


def flavour_of_created(event: dict) -> str | None:
    """The flavour a `session.created` shows, None when it does not tell."""
    session = event.get("session")
    if not isinstance(session, dict):
        # vLLM's session.created is {type, id, created}: no session object at all.
        return "vllm"
    if session.get("type") == "realtime":
        return "openai"
    if session.get("object") == "realtime.session" or "modalities" in session \
            or "input_audio_format" in session:
        return "openai-beta"
    return None


def session_terms(event: dict, protocol: str, rate_hz: int | None, frame_ms: float,
                  budget_ms: float | None, tokens_out: int | None) -> SessionTerms:
    """The terms of a session from its `session.created`; the arguments are the client's
    settings (None: the flavour's default, or the frame period for the budget)."""
    session = event.get("session") if isinstance(event.get("session"), dict) else {}
    info = session.get("metronome") if isinstance(session.get("metronome"), dict) else {}
    if protocol == "auto":
        flavour = flavour_of_created(event)
        decided_by = "session.created" if flavour else "undecided"
    else:
        flavour, decided_by = protocol, "flag"
    # The rate the session says wins (the audio is made at it); then the client's setting.
    stated = (((session.get("audio") or {}).get("input") or {}).get("format") or {}).get("rate")
    rate = info.get("sample_rate_hz") or stated or rate_hz or \
        DEFAULT_RATE_HZ.get(flavour, DEFAULT_RATE_HZ["openai"])
    period = info.get("frame_ms", frame_ms)
    return SessionTerms(
        protocol=flavour, decided_by=decided_by, rate_hz=int(rate), frame_ms=float(period),
        budget_ms=float(info.get("budget_ms") or budget_ms or period),
        # A server that does not say how many tokens a frame owes: its first delta answers it.
        tokens_out=int(info.get("tokens_out") or tokens_out or 1),
        per_frame=bool(info), server_session=info.get("session_id", event.get("id")))


# --- what the client sends -------------------------------------------------------------------
def opening(protocol: str | None, rate_hz: int, model: str | None) -> list[dict]:
    """Sent right after `session.created`, before any audio. Undecided: nothing (the client
    does not know which dialect would be understood)."""
    if protocol == "openai":
        return [{"type": "session.update", "session": {
            "type": "realtime", "output_modalities": ["text"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate_hz}}}}}]
    if protocol == "openai-beta":
        return [{"type": "session.update",
                 "session": {"modalities": ["text"], "input_audio_format": "pcm16"}}]
    if protocol == "vllm":
        # vLLM validates the model on session.update (no answer when it is served) and starts
        # its streaming request on the first commit; the audio then flows into that request.
        update = {"type": "session.update"} | ({"model": model} if model else {})
        return [update, {"type": "input_audio_buffer.commit"}]
    return []


def awaits_update(protocol: str | None) -> bool:
    """Whether the server answers session.update (`session.updated`, or an `error`): the
    OpenAI flavours do; vLLM answers only a refusal."""
    return protocol in ("openai", "openai-beta")


def after_first_append(protocol: str | None) -> list[dict]:
    # One response.create: a server that waits for one per turn gets it (the client speaks a
    # single turn); Metronome's gateway answers every frame without it and accepts it.
    return [{"type": "response.create"}] if protocol in ("openai", "openai-beta") else []


def closing(protocol: str | None) -> list[dict]:
    """Sent after the last frame: vLLM's final commit ends the audio of its request."""
    return [{"type": "input_audio_buffer.commit", "final": True}] if protocol == "vllm" else []


# --- how the client reads the server ---------------------------------------------------------
@dataclass(frozen=True)
class Reading:
    """One server event as the record takes it."""

    kind: str  # delta, truth, updated, error, final or other (lifecycle: counted only)
    type: str
    frame_idx: int | None = None  # None: the server did not mark the delta's frame
    tokens: int = 1  # without metronome.tokens a delta counts as one (its text is kept)
    text: str = ""
    truth: dict | None = None
    code: str | None = None
    message: str | None = None
    error_type: str | None = None


def _index(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def read(event: dict) -> Reading:
    kind = event.get("type")
    kind = kind if isinstance(kind, str) else "?"
    if kind in DELTA_EVENTS:
        meta = event.get("metronome") if isinstance(event.get("metronome"), dict) else {}
        tokens = meta.get("tokens")
        text = event.get("delta")
        return Reading("delta", kind, _index(meta.get("frame_idx")),
                       tokens if _index(tokens) else 1, text if isinstance(text, str) else "")
    if kind == FRAME_TRUTH and isinstance(event.get("frame"), dict):
        return Reading("truth", kind, _index(event["frame"].get("frame_idx")),
                       truth=event["frame"])
    if kind == "response.done":
        # Old Metronome servers sent each frame's truth here; now it is one per response.
        truth = (event.get("response") or {}).get("metronome")
        if isinstance(truth, dict) and _index(truth.get("frame_idx")) is not None:
            return Reading("truth", kind, truth["frame_idx"], truth=truth)
    if kind == "session.updated":
        return Reading("updated", kind)
    if kind == "error":
        err = event.get("error")
        if isinstance(err, dict):  # OpenAI: {error: {type, code, message}}
            return Reading("error", kind, code=err.get("code"), message=err.get("message"),
                           error_type=err.get("type"))
        # vLLM: {error: "message", code}
        return Reading("error", kind, code=event.get("code"), message=str(err))
    if kind == FINAL:
        return Reading("final", kind, text=str(event.get("text") or ""))
    return Reading("other", kind)
