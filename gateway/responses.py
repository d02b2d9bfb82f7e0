"""One connection's responses: a frame-synchronous session framed as Realtime responses.

A full-duplex model answers every frame whether asked or not, so a response here is a span of
frames, not an answer to one request:

    opens     with the first frame that has output (a delta or its row) while none is open:
              response.created → response.output_item.added → response.content_part.added
    streams   each frame's words as `response.output_text.delta` (beta: response.text.delta),
              decoded as they come, with `metronome.frame_idx`; each frame's recorded row as
              `metronome.frame` (SDK clients ignore it), in or out of a response
    ends      once the frames of the audio committed so far (`input_audio_buffer.commit`: the
              end of the speaker's turn) are all recorded: response.output_text.done →
              response.content_part.done → response.output_item.done → response.done
              (completed); at `response.cancel` (cancelled: the cancelled frames' later words
              are dropped, their rows still go); or when the session closes (incomplete)
`response.create` is accepted and needs no answer of its own: the open response is already
answering, and with none open the next frame opens one (what server VAD's create_response
does). This keeps each frame's truth where a load tool reads it (`metronome.frame`) and gives an
SDK client the lifecycle it waits for: append audio, commit, response.create, then events until
`response.done`.
"""

from __future__ import annotations

import itertools
from collections import deque

from gateway import protocol
from gateway.protocol import NAMES

_response_ids = itertools.count(1)
MAX_DONE_CHARS = 64 * 1024  # ~16k tokens of text: a turn's worth, bounded per connection


class Responses:
    """Server events for one connection, from what the run and the client did (event loop
    only). Each method returns the events to send, in order."""

    def __init__(self, session_id: str, decoder=None, dialect: str = "ga") -> None:
        self.session_id = session_id
        self.decoder = decoder  # engine.text.StreamDecoder, or None: no words
        self.dialect = dialect
        self._open: dict | None = None  # the open response: id, item_id, text, frames
        self._through: int | None = None  # end the open response once this frame is recorded
        self._cancelled_through = -1  # frames whose words a cancel dropped
        self._last_row = -1  # the last frame recorded

    @property
    def names(self) -> dict:
        return NAMES[self.dialect]

    # --- what the run sends ---------------------------------------------------------------
    def delta(self, frame_idx: int, n: int, token_ids: list[int] | None) -> list[dict]:
        if frame_idx <= self._cancelled_through:
            return []
        events = self._close_if_past(frame_idx) + self._ensure_open()
        text = self.decoder.step(token_ids) if self.decoder and token_ids else ""
        resp = self._open
        resp["last_delta"] = max(resp["last_delta"], frame_idx)
        if text:
            _keep(resp, text)
        events.append(protocol.event(
            self.names["text_delta"], response_id=resp["id"], item_id=resp["item_id"],
            output_index=0, content_index=0, delta=text,
            metronome={"frame_idx": frame_idx, "tokens": n, "token_ids": token_ids}))
        return events

    def frame(self, row: dict) -> list[dict]:
        idx = row["frame_idx"]
        self._last_row = max(self._last_row, idx)
        events = self._close_if_past(idx)
        if idx > self._cancelled_through and self._open is None and row["tokens_out"]:
            events += self._ensure_open()
        resp = self._open
        if resp is not None:
            resp["frames"] += 1
            resp["silent"] += bool(row["silent"])
        events.append(protocol.frame_event(row, resp and resp["id"]))
        if resp is not None and self._through is not None and idx >= self._through:
            events += self._close("completed")
        return events

    # --- what the client asks ---------------------------------------------------------------
    def commit(self, through: int) -> list[dict]:
        """The client's audio so far is a turn: its frames up to `through` end the response."""
        item = f"item_{self.session_id}_{through}"
        events = [protocol.event("input_audio_buffer.committed", item_id=item,
                                 previous_item_id=None)]
        if self._open is None:
            return events
        if self._last_row >= through:
            return events + self._close("completed")
        self._through = through
        return events

    def cancel(self) -> list[dict]:
        if self._open is None:
            return []
        self._cancelled_through = max(self._last_row, self._open["last_delta"])
        return self._close("cancelled")

    def closed(self) -> list[dict]:
        """The session ended (the client left, was evicted, or the run ended)."""
        return self._close("incomplete") if self._open is not None else []

    # --- the lifecycle ------------------------------------------------------------------------
    def _close_if_past(self, idx: int) -> list[dict]:
        if self._open is not None and self._through is not None and idx > self._through:
            return self._close("completed")
        return []

    def _ensure_open(self) -> list[dict]:
        if self._open is not None:
            return []
        n = next(_response_ids)
        resp = self._open = {"id": f"resp_{self.session_id}_{n}",
                             "item_id": f"msg_{self.session_id}_{n}", "pieces": deque(),
                             "chars": 0, "frames": 0,
                             "silent": 0, "last_delta": -1}
        self._through = None
        item = self._item(resp, "in_progress", [])
        return [protocol.event("response.created", response=self._response(resp, "in_progress",
                                                                          [])),
                protocol.event("response.output_item.added", response_id=resp["id"],
                               output_index=0, item=item),
                protocol.event("response.content_part.added", response_id=resp["id"],
                               item_id=resp["item_id"], output_index=0, content_index=0,
                               part=self._part(""))]

    def _close(self, status: str) -> list[dict]:
        resp, self._open, self._through = self._open, None, None
        ids = {"response_id": resp["id"], "item_id": resp["item_id"], "output_index": 0}
        text = "".join(resp["pieces"])
        part = self._part(text)
        item = self._item(resp, "completed" if status == "completed" else "incomplete", [part])
        return [protocol.event(self.names["text_done"], **ids, content_index=0, text=text),
                protocol.event("response.content_part.done", **ids, content_index=0, part=part),
                protocol.event("response.output_item.done", response_id=resp["id"],
                               output_index=0, item=item),
                protocol.event("response.done", response=self._response(resp, status, [item]))]

    def _part(self, text: str) -> dict:
        return {"type": self.names["content"], "text": text}

    @staticmethod
    def _item(resp: dict, status: str, content: list) -> dict:
        return {"id": resp["item_id"], "object": "realtime.item", "type": "message",
                "role": "assistant", "status": status, "content": content}

    def _response(self, resp: dict, status: str, output: list) -> dict:
        key = "output_modalities" if self.dialect == "ga" else "modalities"
        return {"id": resp["id"], "object": "realtime.response", "status": status,
                "output": output, key: ["text"],
                "metronome": {"frames": resp["frames"], "silent_frames": resp["silent"]}}


def _keep(resp: dict, text: str) -> None:
    """The words `response.done` repeats: the last MAX_DONE_CHARS of them (a session that
    never commits has one response for its whole life; the deltas carried every word)."""
    resp["pieces"].append(text)
    resp["chars"] += len(text)
    while resp["chars"] - len(resp["pieces"][0]) >= MAX_DONE_CHARS:
        resp["chars"] -= len(resp["pieces"].popleft())
