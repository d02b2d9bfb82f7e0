"""Sessions on its own: open, one frame (submit / skip / rollover), the tick's counts, close
and the stall guard's eviction, on a scripted engine whose clock the test moves."""

import pytest
from runtime_factories import ScriptedEngine, config, control, gate, recorder

from engine.contract import KVPolicy
from runtime.sessions import Sessions

FRAME_S = 0.08


def _sessions(cfg=None, engine=None):
    cfg = cfg or config()
    engine = engine or ScriptedEngine(policy=cfg.kv_policy())
    rec = recorder(cfg)
    g = gate(cfg)
    sessions = Sessions(cfg, engine, rec, g, control(g, cfg), cfg.load_config())
    return sessions, engine, rec, g


def _open(sessions, g, session_id, t_rel=0.0, rank=None, source=None):
    ticket = g.acquire(None)
    return sessions.open(session_id, ticket, t_rel, rank, source)


def _finish_all(engine, t):
    for _, _, h in engine.submitted:
        if h.t_done is None:
            h.add_tokens(h.max_new, t)
            h.finish(t)


def test_a_session_opens_on_the_next_tick_on_the_rank_the_engine_says():
    sessions, engine, _, g = _sessions(engine=ScriptedEngine(place={7: 0}))
    assert _open(sessions, g, 7, t_rel=0.05) == pytest.approx(FRAME_S)
    assert engine.opened == [(7, None)] and sessions.live[7].rank == 0


def test_each_frame_is_submitted_and_the_next_one_is_on_the_start_grid():
    sessions, engine, rec, g = _sessions()
    start = _open(sessions, g, 1)
    assert sessions.on_frame(1, start) == pytest.approx(start + FRAME_S)
    (sid, tokens, _), = engine.submitted
    assert sid == 1 and len(tokens) == 16
    engine.clock = 0.03
    _finish_all(engine, 0.03)
    engine.clock = FRAME_S
    sessions.on_frame(1, FRAME_S)  # finalises frame 0: answered in 30 ms
    (row,) = rec.writer.rows["frames"]
    assert row["frame_idx"] == 0 and row["on_time"] and row["latency_ms"] == pytest.approx(30)


def test_a_frame_queues_behind_one_a_step_from_done_and_is_skipped_otherwise():
    sessions, engine, rec, g = _sessions()  # 4 tokens out a frame
    _open(sessions, g, 1)
    sessions.on_frame(1, 0.0)
    first = engine.submitted[0][2]
    first.add_tokens(3, 0.07)  # one token short at the next frame time
    engine.clock = FRAME_S
    sessions.on_frame(1, FRAME_S)  # frame 0 a step from done: frame 1 is queued behind it
    assert len(engine.submitted) == 2
    second = engine.submitted[1][2]
    first.add_tokens(1, FRAME_S + 0.002)  # frame 0 ends 2 ms late: its token still counts
    first.finish(FRAME_S + 0.002)
    assert sessions.tick_counts(FRAME_S + 0.003).tokens_out == 4
    second.add_tokens(2, FRAME_S + 0.03)
    engine.clock = 2 * FRAME_S
    sessions.on_frame(1, 2 * FRAME_S)  # frame 1 two tokens short: frame 2 is not submitted
    assert len(engine.submitted) == 2
    second.add_tokens(1, 2 * FRAME_S + 0.01)
    engine.clock = 3 * FRAME_S
    sessions.on_frame(1, 3 * FRAME_S)  # frame 1 a step from done again: frame 3 queues
    assert len(engine.submitted) == 3
    skipped = [r for r in rec.writer.rows["frames"] if r["skipped"]]
    assert [r["frame_idx"] for r in skipped] == [2] and skipped[0]["censored"]
    frame0 = next(r for r in rec.writer.rows["frames"] if r["frame_idx"] == 0)
    assert frame0["censored"] and frame0["tokens_out"] == 3  # late: only what came in time


def test_a_frame_is_skipped_behind_two_owed_frames():
    sessions, engine, rec, g = _sessions()
    _open(sessions, g, 1)
    sessions.on_frame(1, 0.0)
    engine.submitted[0][2].add_tokens(3, 0.07)
    engine.clock = FRAME_S
    sessions.on_frame(1, FRAME_S)  # queued behind frame 0
    engine.submitted[1][2].add_tokens(3, FRAME_S + 0.07)  # (a scripted engine: out of order)
    engine.clock = 2 * FRAME_S
    sessions.on_frame(1, 2 * FRAME_S)  # frames 0 and 1 owed: frame 2 is not submitted
    assert len(engine.submitted) == 2
    assert [r["frame_idx"] for r in rec.writer.rows["frames"] if r["skipped"]] == [2]


def test_a_frame_two_steps_behind_queues_when_the_pace_lets_it_keep_its_budget():
    # 4 tokens out, an 80 ms budget. Frame 0 two tokens short at the next frame time:
    # at 8 ms a token, (2 left + 4 own) x 8 = 48 ms <= 80: queued behind it; at 15 ms a
    # token, 90 ms > 80: skipped; two tokens at one instant (no pace): skipped.
    for gap_s, queued in ((0.008, True), (0.015, False), (0.0, False)):
        sessions, engine, rec, g = _sessions()
        _open(sessions, g, 1)
        sessions.on_frame(1, 0.0)
        first = engine.submitted[0][2]
        first.add_tokens(1, 0.06)
        first.add_tokens(1, 0.06 + gap_s)
        engine.clock = FRAME_S
        sessions.on_frame(1, FRAME_S)
        assert len(engine.submitted) == (2 if queued else 1), gap_s
        skipped = [r["frame_idx"] for r in rec.writer.rows["frames"] if r["skipped"]]
        assert skipped == ([] if queued else [1]), gap_s


def test_the_tick_counts_tokens_out_and_frames_owed_per_rank():
    sessions, engine, _, g = _sessions(engine=ScriptedEngine(ranks=2, place={1: 0, 2: 1}))
    _open(sessions, g, 1)
    _open(sessions, g, 2)
    sessions.on_frame(1, 0.0)
    sessions.on_frame(2, 0.0)
    h1 = engine.submitted[0][2]
    h1.add_tokens(2, 0.01)
    engine.clock = 0.05  # both submitted over half a frame ago; session 2 has no token yet
    counts = sessions.tick_counts(engine.clock)
    assert (counts.tokens_out, counts.frames_owed) == (2, 2)
    assert counts.on(0, fleet=2) == (2, 1) and counts.on(1, fleet=2) == (0, 1)
    assert counts.on(0, fleet=1) == (2, 2)  # a fleet of one owns them all
    assert sessions.tick_counts(engine.clock).tokens_out == 0  # counted once
    assert sessions.live_by_rank() == {0: 1, 1: 1}


def test_a_window_session_rolls_over_before_max_model_len_with_sinks_and_window():
    cfg = config(policy="window", window=32, sinks=0)
    engine = ScriptedEngine(policy=cfg.kv_policy(), max_model_len=60)
    sessions, engine, rec, g = _sessions(cfg, engine)
    _open(sessions, g, 1)
    t = 0.0
    for _ in range(4):  # 19 KV tokens a frame: the fourth would pass 60
        engine.clock = t
        sessions.on_frame(1, t)
        _finish_all(engine, t + 0.01)
        t += FRAME_S
    assert engine.closed == [1] and engine.opened == [(1, None), (1, 0)]  # same rank
    assert rec.totals.rollovers == 1 and rec.writer.events("rollover")[0]["prompt_tokens"] == 32
    assert len(engine.submitted[-1][1]) == 32 + 16  # the last W tokens, then the new frame


def test_an_unbounded_session_ends_at_max_model_len():
    sessions, engine, rec, g = _sessions(engine=ScriptedEngine(max_model_len=30))
    _open(sessions, g, 1)
    engine.clock = 0.0
    sessions.on_frame(1, 0.0)
    _finish_all(engine, 0.01)
    engine.clock = FRAME_S
    assert sessions.on_frame(1, FRAME_S) is None and 1 not in sessions.live
    assert rec.writer.events("close")[0]["reason"] == "max_model_len"
    assert g.live == 0  # its ticket went back


def test_a_source_that_knows_why_it_ended_names_the_close():
    class Gone:
        end_reason = "client disconnected"
        closed = False

        def next_frame(self, frame_s):
            return None

        def close(self):
            Gone.closed = True

    sessions, _, rec, g = _sessions()
    _open(sessions, g, 1, source=Gone())
    assert sessions.on_frame(1, 0.0) is None
    assert rec.writer.events("close")[0]["reason"] == "client disconnected" and Gone.closed


def test_the_stall_guard_evicts_the_largest_session_on_the_stalled_rank():
    sessions, engine, rec, g = _sessions(engine=ScriptedEngine(ranks=2, place={1: 0, 2: 0,
                                                                               3: 1}))
    for sid in (1, 2, 3):
        _open(sessions, g, sid)
    sessions.live[1].kv_tokens, sessions.live[2].kv_tokens, sessions.live[3].kv_tokens = 10, 50, 90
    assert sessions.evict_largest(1.0, rank=0)
    assert set(sessions.live) == {1, 3} and rec.totals.evicted == 1
    (evict,) = rec.writer.events("evict")
    assert evict["session_id"] == 2 and evict["rank"] == 0
    assert not sessions.evict_largest(1.0, rank=5)  # nobody there


def test_an_evicted_session_s_owed_frame_is_silent_by_the_guard():
    sessions, engine, rec, g = _sessions()
    _open(sessions, g, 1)
    sessions.on_frame(1, 0.0)
    engine.clock = 0.2
    sessions.evict_largest(0.2)
    (row,) = rec.writer.rows["frames"]
    assert row["silent"] and row["silent_cause"] == "guard"


def test_after_a_live_w_change_the_rollover_history_follows_and_sinks_only_shrink():
    cfg = config(policy="window", window=64, sinks=32)
    sessions, engine, _, g = _sessions(cfg)
    _open(sessions, g, 1)
    history = sessions.live[1].history
    assert history.window.maxlen == 64 and history.sink_target == 32
    engine._policy = KVPolicy("window", 128, 0)
    sessions.follow_policy()
    assert history.window.maxlen == 128 and history.sink_target == 0
