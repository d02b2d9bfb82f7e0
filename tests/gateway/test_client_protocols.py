"""The load client against fake servers of each realtime flavour (tests/gateway/
fake_realtime.py): what it sends (each flavour's session.update, the response.create, vLLM's
start and final commits), how it tells the flavour, and how deltas find frames by the
definition in docs/GATEWAY.md ("What the load client measures")."""

from __future__ import annotations

import functools
import json

import duckdb
import pytest

from gateway import client_protocols as dialect
from gateway.client import LoadClientConfig, run_load
from gateway.client_record import BY_LATEST, ClientRecord
from gateway.client_protocols import SessionTerms
from store import open_store
from tests.gateway import fake_realtime as fake
from tests.gateway.fake_realtime import FakeServer, appends


def _load(server: FakeServer, store=None, **settings) -> dict:
    cfg = LoadClientConfig(url=server.url, **{"sessions": 1, "frame_ms": 40.0, **settings})
    return run_load(cfg, store)


def _record_frames(monkeypatch):
    """The client's ClientRecord, kept to look at its frames after the run."""
    kept = []
    original = ClientRecord.__init__

    def init(self, *args, **kw):
        original(self, *args, **kw)
        kept.append(self)

    monkeypatch.setattr(ClientRecord, "__init__", init)
    return kept


def test_ga_metronome_frames_by_frame_idx_with_truth_text_and_the_run_row(tmp_path,
                                                                          monkeypatch):
    records = _record_frames(monkeypatch)
    db = str(tmp_path / "client.duckdb")
    store = open_store(db)
    with FakeServer(fake.ga_metronome) as server:
        # 1.2 s: a loaded CI core took most of 0.6 s to open the session (no frame was sent)
        summary = _load(server, store, duration_s=1.2)
    store.close()
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT * FROM frames WHERE run_id = ? ORDER BY frame_idx",
                           [summary["run_id"]]).df().to_dict("records")
        model, settings = con.execute("SELECT model, settings FROM runs WHERE run_id = ?",
                                      [summary["run_id"]]).fetchone()
    got = server.got[0]
    # Sent: the GA session.update at the session's rate, then audio, one response.create
    # right after the first append, appends of one 40 ms frame at 24 kHz.
    assert got[0] == {"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["text"],
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24_000}}}}}
    assert [e["type"] for e in got[1:3]] == ["input_audio_buffer.append", "response.create"]
    assert [e["type"] for e in got].count("response.create") == 1
    assert set(appends(got)) == {960}
    assert summary["protocol"] == "openai"
    assert summary["protocol_sessions"] == {"openai (session.created)": 1}
    assert summary["frame_mapping"] == "server frame_idx"
    assert summary["deltas_unmapped"] == {} and summary["protocol_mismatches"] == 0
    # Lifecycle events are counted, never taken for a frame's truth.
    assert summary["server_events"]["response.done"] == 1
    assert summary["server_events"]["response.created"] == 1
    frames = records[0].frames
    n = len(frames)
    assert n >= 10 and summary["frames"] == n and summary["missing_frames"] == 0
    for (_, k), f in frames.items():
        assert f.done is not None and f.done["frame_idx"] == k
        assert f.text == ("" if k == 3 else "".join(fake.frame_text(k)))
    assert summary["silent_frames"] == summary["empty_frames"] == 1
    silent = [r for r in rows if r["silent"]]
    assert [(r["frame_idx"], r["silent_cause"]) for r in silent] == [(3, "empty")]
    assert all(r["complete"] and r["tokens_out"] == 2 for r in rows if not r["silent"])
    settings = json.loads(settings)
    assert model == server.url
    assert (settings["protocol"], settings["protocol_spoken"], settings["frame_mapping"]) == \
        ("auto", "openai", "server frame_idx")


def test_beta_without_frame_markers_gives_each_delta_to_the_latest_frame_sent(monkeypatch):
    records = _record_frames(monkeypatch)
    with FakeServer(fake.beta) as server:
        summary = _load(server, duration_s=0.5)
    got = server.got[0]
    assert got[0] == {"type": "session.update",
                      "session": {"modalities": ["text"], "input_audio_format": "pcm16"}}
    assert got[2]["type"] == "response.create"
    assert set(appends(got)) == {960}  # beta's pcm16 is 24 kHz
    assert (summary["protocol"], summary["frame_mapping"]) == ("openai-beta", BY_LATEST)
    assert summary["tokens_expected"] == 1 and summary["silent_frames"] == 0
    for (_, k), f in records[0].frames.items():
        assert f.text == f"t{k} " and f.done is None
        assert 0 <= (f.t_done - f.t_sent) * 1e3 < 40


def test_an_old_metronome_server_is_read_by_its_response_done(monkeypatch):
    records = _record_frames(monkeypatch)
    with FakeServer(fake.old_metronome) as server:
        summary = _load(server, duration_s=0.4, protocol="openai-beta")
    assert set(appends(server.got[0])) == {640}  # the session says 16 kHz: made at it
    assert summary["protocol_sessions"] == {"openai-beta (flag)": 1}
    assert summary["frame_mapping"] == "server frame_idx"
    assert summary["errors"] == {"unknown_event": 1}  # its answer to response.create
    assert all(f.done == {"frame_idx": k, "silent": False}
               for (_, k), f in records[0].frames.items())


def _segment_frames(n_frame: int, segment: int, count: int) -> list[int]:
    """The frame whose append completes each of `count` segments of audio."""
    return [next(k for k in range(10_000) if (k + 1) * n_frame >= (j + 1) * segment)
            for j in range(count)]


def _check_segments(frames: dict, answered: dict) -> None:
    """Frames named in `answered` hold that text; every other frame is silent."""
    for (_, k), f in sorted(frames.items()):
        assert f.text == answered.get(k, ""), k
        assert (f.tokens == 0) == (k not in answered), k


def test_vllm_segments_the_silence_between_and_a_late_tail(monkeypatch):
    records = _record_frames(monkeypatch)
    script = functools.partial(fake.vllm_like, segment_s=1.0, tail_delay_s=0.3)
    with FakeServer(script) as server:
        summary = _load(server, duration_s=2.2, frame_ms=80.0, model="m")
    got = server.got[0]
    assert got[:2] == [{"type": "session.update", "model": "m"},
                       {"type": "input_audio_buffer.commit"}]
    assert got[-1] == {"type": "input_audio_buffer.commit", "final": True}
    assert "response.create" not in [e["type"] for e in got]
    assert set(appends(got)) == {1280}  # 80 ms at 16 kHz
    assert summary["protocol_sessions"] == {"vllm (session.created)": 1}
    assert summary["frame_mapping"] == BY_LATEST
    frames = records[0].frames
    segs = _segment_frames(1280, 16_000, 2)
    _check_segments(frames, {k: f"s{j}a s{j}b " for j, k in enumerate(segs)})
    # The tail came 0.3 s after the final commit, past the last frame's deadline: no frame
    # takes it, and it is counted.
    assert summary["deltas_unmapped"] == {"after the latest frame's deadline": 1}
    assert summary["silent_frames"] == summary["no_delta_frames"] == len(frames) - 2
    assert summary["server_events"]["transcription.done"] == 1


@pytest.mark.slow
def test_vllm_five_seconds_of_silence_then_a_segment(monkeypatch):
    records = _record_frames(monkeypatch)
    with FakeServer(functools.partial(fake.vllm_like, segment_s=5.0)) as server:
        summary = _load(server, duration_s=5.6, frame_ms=80.0, protocol="vllm", model="m")
    frames = records[0].frames
    (seg,) = _segment_frames(1280, 80_000, 1)
    last = max(k for _, k in frames)
    assert seg == 62 and last > seg + 2
    # Nothing for 5 s: frames 0..61 silent; the segment's deltas on the frame that completed
    # it (the latest sent when they came); silent again until the tail, which the final commit
    # brings within the last frame's deadline.
    _check_segments(frames, {seg: "s0a s0b ", last: "tail "})
    assert 0 <= (frames[(0, seg)].t_done - frames[(0, seg)].t_sent) * 1e3 < 80
    assert summary["protocol_sessions"] == {"vllm (flag)": 1}
    assert summary["deltas_unmapped"] == {}


def test_vllm_without_a_model_is_refused_and_says_so():
    with FakeServer(fake.vllm_like) as server:
        summary = _load(server, duration_s=0.3)
    assert server.got[0][0] == {"type": "session.update"}
    assert summary["protocol"] == "vllm"
    assert summary["errors"] == {"invalid_event": 1, "model_not_validated": 2}
    assert summary["silent_frames"] == summary["frames"]


def test_an_undecided_session_is_told_by_its_first_delta_and_sends_no_dialect():
    with FakeServer(fake.undecided) as server:
        summary = _load(server, duration_s=0.3, sessions=2)
    for got in server.got:
        assert {e["type"] for e in got} == {"input_audio_buffer.append"}
        assert set(appends(got)) == {960}  # the OpenAI default, 24 kHz
    assert summary["protocol"] == "openai"
    assert summary["protocol_sessions"] == {
        "openai (first delta (response.output_text.delta))": 2}


def test_auto_detection_from_session_created():
    def created(session=None, **top):
        return {"type": "session.created", **({"session": session} if session is not None
                                               else {}), **top}
    assert dialect.flavour_of_created(created({"type": "realtime",
                                               "object": "realtime.session"})) == "openai"
    assert dialect.flavour_of_created(created({"modalities": ["text"]})) == "openai-beta"
    assert dialect.flavour_of_created(created(id="sess-1", created=1)) == "vllm"
    assert dialect.flavour_of_created(created({"metronome": {}})) is None


def test_the_record_maps_by_the_definition_and_counts_the_rest():
    rec = ClientRecord("r", "ws://x", budget_ms=80.0, tokens_expected=1)
    clock = iter([0.0, 0.05, 0.10, 0.19, 0.20, 0.21, 0.40]).__next__
    rec.now = clock
    rec.open(0, SessionTerms("vllm", "flag", 16_000, 80.0, 80.0, 1, per_frame=False))
    rec.delta(0, None, 1, "early")  # t 0.00: nothing sent yet
    rec.sent(0, 0)  # t 0.05
    rec.delta(0, None, 1, "a")  # t 0.10: frame 0, 50 ms
    rec.delta(0, None, 1, "b")  # t 0.19: frame 0's deadline (0.13) passed, none sent since
    rec.sent(0, 1)  # t 0.20
    rec.delta(0, 7, 1, "c")  # t 0.21: a frame the client never sent
    rec.delta(0, None, 1, "d")  # t 0.40: frame 1's deadline (0.28) passed
    assert rec.frames[(0, 0)].text == "a" and rec.frames[(0, 1)].tokens == 0
    assert dict(rec.unmapped) == {"before the first frame": 1, "unknown frame_idx": 1,
                                  "after the latest frame's deadline": 2}
    rows = rec.frame_rows()
    assert rows[0]["latency_ms"] == pytest.approx(50.0) and rows[0]["on_time"]
    assert rows[1]["silent"] and rows[1]["silent_cause"] == "no_delta"


@pytest.mark.parametrize("settings, message", [
    ({"protocol": "grpc"}, r"protocol 'grpc' is not one of auto, openai"),
    ({"protocol": "vllm"}, r"protocol vllm needs --model"),
    ({"sample_rate_hz": 4000}, r"sample rate 4000 Hz must be in \[8000, 48000\]"),
    ({"budget_ms": 0}, r"budget 0 ms must be in \[1, 60000\]")])
def test_settings_name_the_bad_value_and_range(settings, message):
    with pytest.raises(ValueError, match=message):
        LoadClientConfig(url="ws://127.0.0.1:1/v1/realtime", **settings)
