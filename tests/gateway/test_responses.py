"""The gateway's pieces without a server: responses over frame spans (commit, cancel, close),
words decoded across deltas, a client's 24 kHz audio cut into the run's frames, text items in
front of the next frame, and the outbox keeping a frame's tokens in order."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from engine.models import resolve_model
from engine.text import TextCodec
from gateway.outbox import Outbox
from gateway.responses import Responses
from load_gen.remote import RemoteFrames
from load_gen.tokenizer import FrameTokenizer


def _row(idx, tokens=2, silent=False):
    return {"frame_idx": idx, "tokens_out": 0 if silent else tokens, "silent": silent}


def _types(events):
    return [e["type"] for e in events]


def test_a_response_spans_the_frames_of_a_turn_and_ends_at_its_commit():
    r = Responses("s1")
    opened = r.delta(0, 2, None)
    assert _types(opened) == ["response.created", "response.output_item.added",
                              "response.content_part.added", "response.output_text.delta"]
    rid = opened[0]["response"]["id"]
    assert _types(r.frame(_row(0))) == ["metronome.frame"]
    r.delta(1, 2, None)
    assert _types(r.commit(2)) == ["input_audio_buffer.committed"]  # frame 2 still to come
    assert _types(r.frame(_row(1))) == ["metronome.frame"]
    r.delta(2, 2, None)
    done = r.frame(_row(2, silent=True))
    assert _types(done) == ["metronome.frame", "response.output_text.done",
                            "response.content_part.done", "response.output_item.done",
                            "response.done"]
    assert done[0]["response_id"] == rid
    assert done[-1]["response"]["status"] == "completed"
    assert done[-1]["response"]["metronome"] == {"frames": 3, "silent_frames": 1}
    # The next frame with output opens the next response.
    nxt = r.delta(3, 2, None)
    assert nxt[0]["type"] == "response.created" and nxt[0]["response"]["id"] != rid


def test_a_commit_after_the_frames_ends_at_once_and_a_cancel_drops_the_rest():
    r = Responses("s2")
    r.delta(0, 1, None)
    r.frame(_row(0))
    assert _types(r.commit(0))[-1] == "response.done"
    r.delta(1, 1, None)
    cancelled = r.cancel()
    assert cancelled[-1]["response"]["status"] == "cancelled"
    assert r.delta(1, 1, None) == []  # the cancelled frame's later words
    assert _types(r.frame(_row(1))) == ["metronome.frame"]  # its truth still goes
    assert r.cancel() == [] and r.closed() == []
    r.delta(2, 1, None)
    assert r.closed()[-1]["response"]["status"] == "incomplete"


def test_beta_names_and_words_decoded_across_deltas():
    codec = TextCodec(resolve_model("tiny"), 2048)
    ids = codec.encode("the session window frame and the window")
    r = Responses("s3", codec.stream(), dialect="beta")
    text = ""
    for k in range(0, len(ids), 2):  # two ids a delta
        events = r.delta(k, len(ids[k:k + 2]), ids[k:k + 2])
        assert all(e["type"] != "response.output_text.delta" for e in events)
        text += events[-1]["delta"]
    assert events[-1]["type"] == "response.text.delta"
    assert text == codec.decode(ids) == "the session window frame and the window"


def test_24_khz_audio_is_cut_into_the_runs_frames_and_text_goes_first():
    tok = FrameTokenizer(16_000, 80.0, 4, 2048)
    frames = RemoteFrames(tok, max_buffer_s=2.0)
    frames.set_rate(24_000)
    assert frames.frame_samples_in == 1920
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(1920 * 3 + 500) * 0.1).astype(np.float32)
    for i in range(0, len(audio), 480):  # 20 ms chunks
        frames.append(audio[i:i + 480])
    assert frames.backlog() == 3  # the 500 extra samples wait for their frame's end
    frames.add_text([5, 6, 7])
    first = frames.next_frame(0.08)
    assert first.token_ids[:3] == [5, 6, 7] and len(first.token_ids) == 3 + 4
    assert len(first.audio) == 1280
    assert len(frames.next_frame(0.08).token_ids) == 4  # the text went once
    assert frames.clear() == 1920 + 500  # a buffered frame and the partial one
    assert frames.backlog() == 0
    try:
        frames.set_rate(16_000)
    except ValueError as exc:
        assert "cannot change rate" in str(exc)
    else:
        raise AssertionError("a rate change after audio was taken")


def test_held_deltas_keep_their_order_and_never_trail_their_row():
    async def main():
        box = Outbox(asyncio.get_running_loop(), 64)
        soon = time.perf_counter() + 0.05
        box.arrive("delta", {"frame_idx": 0, "n": 1, "at": soon, "token_ids": [1]})
        box.arrive("delta", {"frame_idx": 0, "n": 1, "at": None, "token_ids": [2]})  # due now
        assert box.queue.empty()  # behind the held one
        await asyncio.sleep(0.08)
        first = await box.batch()
        box.arrive("delta", {"frame_idx": 1, "n": 1, "at": time.perf_counter() + 5,
                             "token_ids": [3]})
        box.arrive("frame", {"row": {"frame_idx": 1}})  # its row flushes what is held
        second = await box.batch()
        return first, second

    first, second = asyncio.run(main())
    assert [d["token_ids"] for _, d in first] == [[1], [2]]
    assert [k for k, _ in second] == ["delta", "frame"]


def test_a_response_that_never_ends_keeps_a_bounded_text_for_its_done():
    from gateway.responses import MAX_DONE_CHARS

    class Words:
        def step(self, ids):
            return "word " * 20  # 100 characters a delta

    r = Responses("s5", Words())
    for k in range(2 * MAX_DONE_CHARS // 100):  # twice the bound, no commit
        r.delta(k, 1, [1])
    text = r.closed()[-1]["response"]["output"][0]["content"][0]["text"]
    assert MAX_DONE_CHARS <= len(text) < MAX_DONE_CHARS + 100  # the last words, bounded
