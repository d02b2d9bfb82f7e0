"""The official `openai` SDK's realtime clients (GA and beta, no hand-made frames) against
`metronome serve` (twin): the GA session at 24 kHz, speech for 3.5 s in 20 ms chunks at real
time, commit and response.create as the SDK's examples do, then events until response.done.
What came back is checked against the server's own record: the deltas' text is the
decoded output ids the server recorded for the session's frames, and the client saw every
frame the server recorded."""

from __future__ import annotations

import asyncio
import base64
import time

import duckdb
import numpy as np
import pytest

from gateway.speech import synthetic_speech

RATE_HZ, CHUNK_S, SPEECH_S = 24_000, 0.02, 3.5


async def _talk(conn, rate_hz: int) -> dict:
    """Speak SPEECH_S of speech at real time, commit, ask for a response; read until done."""
    audio = (np.clip(synthetic_speech(1, rate_hz, SPEECH_S), -1, 32767 / 32768) * 32768)
    pcm = audio.astype("<i2").tobytes()
    step = round(rate_hz * CHUNK_S) * 2

    async def speak():
        start = time.perf_counter()
        for k, i in enumerate(range(0, len(pcm), step)):
            await asyncio.sleep(max(0.0, start + (k + 1) * CHUNK_S - time.perf_counter()))
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + step]).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()

    speaker = asyncio.create_task(speak())
    got: dict = {"types": [], "text": [], "frames": [], "errors": [], "done": None}
    async with asyncio.timeout(30):
        async for event in conn:
            got["types"].append(event.type)
            if event.type in ("response.output_text.delta", "response.text.delta"):
                got["text"].append(event.delta)
            elif event.type == "metronome.frame":  # not the SDK's: it keeps it as it came
                got["frames"].append(event.frame["frame_idx"])
            elif event.type == "error":
                got["errors"].append(event.error.code)
            elif event.type == "response.done":
                got["done"] = event.response
                break
    await speaker
    return got


def _server_words(db, session_id: int) -> tuple[list[int], str]:
    from engine.models import resolve_model
    from engine.text import TextCodec

    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT frame_idx, out_ids FROM frames WHERE session_id = ? "
                           "ORDER BY frame_idx", [session_id]).fetchall()
    ids = [i for _, out in rows for i in (out or [])]
    return [idx for idx, _ in rows], TextCodec(resolve_model("tiny"), 2048).decode(ids)


@pytest.mark.slow
def test_the_official_sdk_gets_the_models_words_and_every_frame(serve):
    from openai import AsyncOpenAI

    server = serve("--sessions", "2", duration=12)
    port = server.port

    async def main():
        client = AsyncOpenAI(api_key="unused", websocket_base_url=f"ws://127.0.0.1:{port}/v1")
        async with client.realtime.connect(model="tiny") as conn:
            created = await conn.recv()
            assert created.type == "session.created"
            assert created.session.audio.input.format.rate == RATE_HZ  # the API's default
            await conn.session.update(session={
                "type": "realtime", "output_modalities": ["text"], "instructions": "listen",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE_HZ}}}})
            updated = await conn.recv()
            assert updated.type == "session.updated", updated
            assert updated.session.instructions == "listen"
            got = await _talk(conn, RATE_HZ)
            return created.session.model_extra["metronome"]["session_id"], got

    session_id, got = asyncio.run(main())
    summary = server.summary()
    assert summary.status == "finished"
    assert got["errors"] == []
    # The lifecycle, in order, around the frames' deltas.
    types = got["types"]
    assert types.index("response.created") < types.index("response.output_item.added") \
        < types.index("response.content_part.added") < types.index("response.output_text.delta")
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.done"]
    assert "input_audio_buffer.committed" in types
    assert got["done"].status == "completed"

    frames, words = _server_words(server.db, session_id)
    whole = int(SPEECH_S / 0.08)  # 43 whole frames; the partial 44th is not a frame
    assert frames == list(range(whole)) and got["frames"] == frames
    text = "".join(got["text"])
    assert text and "·" not in text
    assert text == words  # the words are the decoded ids the server recorded
    assert got["done"].output[0].content[0].text == text


@pytest.mark.slow
def test_a_beta_sdk_client_gets_the_beta_names(serve):
    from openai import AsyncOpenAI

    server = serve("--sessions", "2", duration=12)

    async def main():
        client = AsyncOpenAI(api_key="unused",
                             websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
        async with client.beta.realtime.connect(model="tiny") as conn:  # OpenAI-Beta header
            created = await conn.recv()
            assert created.type == "session.created"
            assert created.session.input_audio_format == "pcm16"
            await conn.session.update(session={"modalities": ["text"],
                                               "input_audio_format": "pcm16"})
            assert (await conn.recv()).type == "session.updated"
            return await _talk(conn, RATE_HZ)

    got = asyncio.run(main())
    server.summary()
    assert got["errors"] == [] and got["done"].status == "completed"
    assert "response.text.delta" in got["types"] and "response.text.done" in got["types"]
    assert "response.output_text.delta" not in got["types"]
    assert "".join(got["text"])
