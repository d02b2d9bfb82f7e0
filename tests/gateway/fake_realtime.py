"""In-process realtime servers, one per flavour the load client speaks, each replaying the event
sequence its kind of server sends (websockets' asyncio server on 127.0.0.1, port 0, in a
thread of its own, since the client under test runs its own event loop). Each connection's
received events are kept, an append's audio as its sample count, so a test can check what the
client sent."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

from websockets.asyncio.server import serve


class FakeServer:
    def __init__(self, script) -> None:
        self.script = script  # async (ws, got: list) -> None, one per connection
        self.got: list[list[dict]] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def __enter__(self) -> FakeServer:
        ready = threading.Event()
        self.loop = asyncio.new_event_loop()

        async def main():
            self.stop = asyncio.Event()
            async with serve(self._handle, "127.0.0.1", 0, ping_interval=None) as server:
                self.port = next(iter(server.sockets)).getsockname()[1]
                ready.set()
                await self.stop.wait()

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),),
                                       daemon=True)
        self.thread.start()
        assert ready.wait(10), "the fake server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)

    async def _handle(self, ws) -> None:
        got: list[dict] = []
        self.got.append(got)
        await self.script(ws, got)


async def send(ws, event: dict) -> None:
    await ws.send(json.dumps(event))


async def received(ws, got: list):
    """The client's events until it leaves; an append is kept as {type, samples}."""
    try:
        async for message in ws:
            event = json.loads(message)
            if event.get("type") == "input_audio_buffer.append":
                event = {"type": event["type"],
                         "samples": len(base64.b64decode(event["audio"])) // 2}
            got.append(event)
            yield event
    except Exception:  # noqa: BLE001 - a client gone mid-message ends the script, as it would
        return


def appends(got: list) -> list[int]:
    return [e["samples"] for e in got if e["type"] == "input_audio_buffer.append"]


def frame_text(k: int) -> list[str]:
    return [f"w{k}a ", f"w{k}b "]


async def ga_metronome(ws, got, frame_ms=40, rate=24_000, empty=(3,)):
    """Metronome's gateway after the GA change: deltas marked with their frame, each frame's
    truth in `metronome.frame`, the response lifecycle around them."""
    n = rate * frame_ms // 1000
    info = {"run_id": "r1", "session_id": 5, "sample_rate_hz": rate, "model_rate_hz": 16_000,
            "frame_ms": frame_ms, "frame_samples": n, "tokens_in": 16, "tokens_out": 2,
            "budget_ms": frame_ms, "max_buffer_s": 2.0}
    await send(ws, {"type": "session.created", "session": {
        "type": "realtime", "object": "realtime.session", "output_modalities": ["text"],
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}},
        "metronome": info}})
    frames = 0
    async for event in received(ws, got):
        if event["type"] == "session.update":
            await send(ws, {"type": "session.updated", "session": event["session"]})
        elif event["type"] == "response.create":
            for kind in ("response.created", "response.output_item.added",
                         "response.content_part.added"):
                await send(ws, {"type": kind, "response_id": "resp_1"})
        elif event["type"] == "input_audio_buffer.append":
            k, frames = frames, frames + 1
            texts = [] if k in empty else frame_text(k)
            for i, text in enumerate(texts):
                await send(ws, {"type": "response.output_text.delta", "response_id": "resp_1",
                                "item_id": "item_1", "delta": text,
                                "metronome": {"frame_idx": k, "tokens": 1, "token_ids": [i]}})
            await send(ws, {"type": "metronome.frame", "frame": {
                "session_id": 5, "frame_idx": k, "silent": not texts, "tokens_out": len(texts),
                "tokens_expected": 2, "censored": not texts, "on_time": bool(texts)}})
            if k == 2:  # per response now, not per frame: never a frame's truth
                await send(ws, {"type": "response.output_text.done", "text": "…"})
                await send(ws, {"type": "response.done", "response": {"id": "resp_1"}})


async def beta(ws, got):
    """An OpenAI beta server without frame markers: each append answered at once."""
    await send(ws, {"type": "session.created", "session": {
        "object": "realtime.session", "modalities": ["text", "audio"],
        "input_audio_format": "pcm16"}})
    frames = 0
    async for event in received(ws, got):
        if event["type"] == "session.update":
            await send(ws, {"type": "session.updated", "session": event["session"]})
        elif event["type"] == "input_audio_buffer.append":
            await send(ws, {"type": "response.text.delta", "delta": f"t{frames} "})
            frames += 1


async def old_metronome(ws, got, frame_ms=40, rate=16_000):
    """Metronome's gateway before the GA change: beta names, a frame's truth in response.done,
    and response.create refused as an unknown event."""
    await send(ws, {"type": "session.created", "session": {
        "object": "realtime.session", "input_audio_format": "pcm16", "modalities": ["text"],
        "metronome": {"session_id": 9, "sample_rate_hz": rate, "frame_ms": frame_ms,
                      "tokens_out": 1, "budget_ms": frame_ms}}})
    frames = 0
    async for event in received(ws, got):
        if event["type"] == "session.update":
            await send(ws, {"type": "session.updated", "session": event["session"]})
        elif event["type"] == "response.create":
            await send(ws, {"type": "error", "error": {
                "type": "invalid_request_error", "code": "unknown_event", "message": "no"}})
        elif event["type"] == "input_audio_buffer.append":
            k, frames = frames, frames + 1
            await send(ws, {"type": "response.text.delta", "delta": "·",
                            "metronome": {"frame_idx": k, "tokens": 1}})
            await send(ws, {"type": "response.done", "response": {
                "status": "completed", "metronome": {"frame_idx": k, "silent": False}}})


async def vllm_like(ws, got, segment_s=1.0, tail_delay_s=0.0, served="m", rate=16_000):
    """vLLM's /v1/realtime as its source reads: session.created {id, created}; session.update
    {model} answered only when refused; the first commit starts the streaming request, the
    final one ends its audio; text per segment of audio (`transcription.delta`), nothing in
    between; `transcription.done` when the request ends. Errors are {error: str, code}."""
    await send(ws, {"type": "session.created", "id": "sess-abc", "created": 1})
    validated = started = False
    buffered, segment, seg, said = 0, int(segment_s * rate), 0, []

    async def say(texts):
        for text in texts:
            said.append(text)
            await send(ws, {"type": "transcription.delta", "delta": text})

    async for event in received(ws, got):
        if event["type"] == "session.update":
            if event.get("model") is None:
                await send(ws, {"type": "error", "error": "Missing required field: model",
                                "code": "invalid_event"})
            elif event["model"] == served:
                validated = True
        elif event["type"] == "input_audio_buffer.commit":
            if not validated:
                await send(ws, {"type": "error", "error": "Model not validated.",
                                "code": "model_not_validated"})
            elif event.get("final"):
                await asyncio.sleep(tail_delay_s)
                await say(["tail "] if buffered else [])
                await send(ws, {"type": "transcription.done", "text": "".join(said),
                                "usage": {"prompt_tokens": 1}})
            else:
                started = True
        elif event["type"] == "input_audio_buffer.append" and started:
            buffered += event["samples"]
            while buffered >= segment:
                buffered -= segment
                await say([f"s{seg}a ", f"s{seg}b "])
                seg += 1


async def undecided(ws, got):
    """A session.created that names no dialect; its deltas do (GA names)."""
    await send(ws, {"type": "session.created", "session": {"id": "s1"}})
    async for event in received(ws, got):
        if event["type"] == "input_audio_buffer.append":
            await send(ws, {"type": "response.output_text.delta", "delta": "x"})
