"""Replay on the twin: a recorded run's sessions offered again, exactly, against other settings;
trace files per session and per frame; what a replay refuses."""

from __future__ import annotations

import pytest

from services.replay_settings import headline, run_config, with_recorded_load
from load_gen import LoadConfig, make_frame_source
from load_gen.trace_load import ReplayFrames
from runtime import RunConfig, execute
from runtime.trace_source import checked_trace, recorded_trace, trace_for
from store import open_store, queries, replay_queries

CLIFF = dict(engine="twin", policy="unbounded", pool_blocks=64, frame_ms=80.0, duration_s=8.0)
ROWS = ("SELECT session_id, frame_idx, t_submit, deadline, latency_ms, tokens_out, "
        "tokens_expected, on_time, silent, skipped FROM frames WHERE run_id = ? ORDER BY 1, 2")


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "replay.duckdb")
    yield path
    open_store(path).close()


def _rows(store, run_id):
    return store.cursor().execute(ROWS, [run_id]).fetchall()


def _replay(db, original: dict, **settings) -> RunConfig:
    args = {"load": "replay", "replay_run": original["run_id"], "replay_db": db,
            "engine": "twin", "pool_blocks": 64, **settings}
    return RunConfig(**with_recorded_load(args))


@pytest.mark.parametrize("load", [
    dict(load="poisson", sessions=14, arrival_rate=3.0, session_s=3.0),
    dict(load="fixed", sessions=10, stagger=True),
    dict(load="poisson", sessions=40, arrival_rate=5.0, session_s=2.0, admission="aimd"),
    dict(load="ramp", sessions=12, stall_guard=True),
], ids=["poisson", "fixed-staggered", "aimd", "ramp-stall-guard"])
def test_replay_with_the_same_settings_records_the_same_frames(db, load):
    store = open_store(db)
    original = execute(RunConfig(**{**CLIFF, **load}), store)
    replay = execute(_replay(db, original, admission=load.get("admission", "fixed"),
                             stall_guard=load.get("stall_guard", False)), store)
    assert replay["status"] == "finished"
    rows = _rows(store, original["run_id"])
    assert len(rows) > 100
    assert _rows(store, replay["run_id"]) == rows  # every column of every frame
    assert (replay["sessions_offered"], replay["admitted"], replay["rejected"]) == \
        (original["sessions_offered"], original["admitted"], original["rejected"])


def test_windowed_replay_of_a_cliff_keeps_arrivals_and_does_not_stall(db):
    store = open_store(db)
    cliff = execute(RunConfig(**CLIFF, load="poisson", sessions=14, arrival_rate=3.0,
                              session_s=4.0), store)
    assert cliff["stalled"]
    slope = execute(_replay(db, cliff, policy="window", window=128), store)
    assert not slope["stalled"] and slope["silent_rate"] < 0.05 < cliff["silent_rate"]
    before = {(r[0], r[1]): r[2] for r in _rows(store, cliff["run_id"])}
    after = {(r[0], r[1]): r[2] for r in _rows(store, slope["run_id"])}
    assert set(after) == set(before)  # same sessions, same frames
    # Same due times; a submitted frame's t_submit is the engine's clock at submission, which
    # on the twin may run past the due time by the step in progress.
    assert max(abs(after[k] - before[k]) for k in before) < 0.040
    row = queries.run_row(store.cursor(), slope["run_id"])
    original = queries.run_row(store.cursor(), cliff["run_id"])
    assert headline(row, original).startswith("same load, W = 128: no stall, p95 ")
    assert headline(original).startswith("original, unbounded: stalled at ")


def test_replay_regenerates_the_same_tokens(db):
    store = open_store(db)
    run = execute(RunConfig(**CLIFF, load="ramp", sessions=5, seed=7), store)
    trace = recorded_trace(run["run_id"], db)
    synthetic = LoadConfig("ramp", 5, seed=7, frame_ms=80.0)
    replay = LoadConfig("replay", 5, seed=7, frame_ms=80.0, replay_run=run["run_id"],
                        replay_db=db)
    for sid in range(5):
        a = make_frame_source(synthetic, sid, 2048, 16)
        b = make_frame_source(replay, sid, 2048, 16, trace)
        frames = [b.next_frame(0.08) for _ in range(trace.sessions[sid].frames)]
        assert frames == [a.next_frame(0.08) for _ in frames]
        assert b.next_frame(0.08) is None  # its recorded end: the runner closes it
    other = ReplayFrames(trace, 0, seed=8, vocab_size=2048).next_frame(0.08)
    assert other != make_frame_source(synthetic, 0, 2048, 16).next_frame(0.08)


def test_sessions_cut_short_by_the_system_are_offered_their_planned_length(db):
    store = open_store(db)
    guarded = execute(RunConfig(**CLIFF, sessions=10, stall_guard=True), store)
    assert guarded["evicted"] >= 1
    trace = recorded_trace(guarded["run_id"], db)
    recorded = replay_queries.replay_frames(store.cursor(), guarded["run_id"], 0.08)
    evicted = set(replay_queries.session_outcomes(store.cursor(), guarded["run_id"]))
    for row in recorded.itertuples():
        planned = 100  # 8 s at 80 ms
        assert trace.sessions[row.session_id].frames == planned
        if row.session_id in evicted:
            assert row.frames < planned - 1


def test_trace_file_per_session_and_per_frame(db, tmp_path):
    csv = tmp_path / "sessions.csv"
    csv.write_text("session_id,start_s,end_s,tokens_in,tokens_out\n"
                   "a,0.5,1.3,16,4\n"  # 0.8 s: 10 frames of 80 ms
                   "b,0.0,0.4,8,4\n")  # 5 frames
    store = open_store(db)
    config = RunConfig(**with_recorded_load(
        {"engine": "twin", "load": "replay", "replay_trace": str(csv), "frame_ms": 80.0,
         "pool_blocks": 64, "stagger": True}))
    assert (config.sessions, config.tokens_in, config.tokens_out) == (2, 16, 4)
    run = execute(config, store)
    frames = replay_queries.replay_frames(store.cursor(), run["run_id"], 0.08)
    # session 0 is the earliest ("b"), started at its own start with stagger
    assert frames.frames.tolist() == [5, 10]
    assert frames.start_s.round(6).tolist() == [0.0, 0.5]

    import pyarrow as pa
    import pyarrow.parquet as pq

    per_frame = tmp_path / "frames.parquet"
    pq.write_table(pa.table({"session_id": [1, 1, 1, 2], "start_s": [0.0, 0.08, 0.16, 0.08],
                             "end_s": [0.08, 0.16, 0.24, 0.16], "tokens_in": [3, 9, 5, 7],
                             "tokens_out": [4, 4, 4, 4]}), per_frame)
    load = LoadConfig("replay", 2, frame_ms=80.0, replay_trace=str(per_frame))
    source = make_frame_source(load, 0, 2048, 16, trace_for(load))
    assert [len(source.next_frame(0.08).token_ids) for _ in range(3)] == [3, 9, 5]
    assert source.next_frame(0.08) is None


@pytest.mark.parametrize("settings, needle", [
    (dict(replay_run="nope"), "run 'nope' is not in"),
    (dict(), "needs exactly one of --replay-run"),
    (dict(replay_run="x", replay_trace="y.csv"), "needs exactly one of --replay-run"),
    (dict(replay_trace="/nonexistent/t.csv"), "trace file /nonexistent/t.csv does not exist"),
])
def test_replay_sources_that_cannot_be_read_are_refused(db, settings, needle):
    with pytest.raises(ValueError, match=needle):
        checked_trace(RunConfig(engine="twin", load="replay", replay_db=db, **settings))


def test_replay_refuses_settings_that_would_change_the_load(db, tmp_path):
    store = open_store(db)
    run = execute(RunConfig(**{**CLIFF, "frame_ms": 160.0}, sessions=4), store)
    base = dict(engine="twin", load="replay", replay_run=run["run_id"], replay_db=db,
                pool_blocks=64)
    with pytest.raises(ValueError, match="frame period 80 ms differs from run .*160 ms"):
        checked_trace(RunConfig(**base))  # a RunConfig reads no store: the check does
    with pytest.raises(ValueError, match="frame period 80 ms differs from run .*160 ms"):
        run_config({**base, "frame_ms": 80.0}, given={"frame_ms"})  # the form's and CLI's way
    runs = len(queries.runs(store.cursor()))
    with pytest.raises(ValueError, match="frame period 80 ms differs from run .*160 ms"):
        execute(RunConfig(**base), store)  # a runner checks before anything starts
    assert len(queries.runs(store.cursor())) == runs
    with pytest.raises(ValueError, match="tokens out 8 differs"):
        checked_trace(RunConfig(**base, frame_ms=160.0, tokens_out=8))
    with pytest.raises(ValueError, match="stagger on differs"):
        checked_trace(RunConfig(**base, frame_ms=160.0, stagger=True))
    with pytest.raises(ValueError, match="only applies to load replay"):
        RunConfig(engine="twin", replay_run=run["run_id"])
    varying = tmp_path / "varying.csv"
    varying.write_text("session_id,start_s,end_s,tokens_in,tokens_out\n1,0,1,16,4\n2,0,1,16,8\n")
    with pytest.raises(ValueError, match="asks 4–8 tokens out per frame"):
        checked_trace(RunConfig(engine="twin", load="replay", replay_trace=str(varying)))
    bad = tmp_path / "bad.csv"
    bad.write_text("session_id,start_s,end_s,tokens_in\n1,0,1,16\n")
    with pytest.raises(ValueError, match="lacks column.*tokens_out"):
        checked_trace(RunConfig(engine="twin", load="replay", replay_trace=str(bad)))
    backwards = tmp_path / "backwards.csv"
    backwards.write_text("session_id,start_s,end_s,tokens_in,tokens_out\n1,2,1,16,4\n")
    with pytest.raises(ValueError, match="row 1: end_s 1 must be after start_s 2"):
        checked_trace(RunConfig(engine="twin", load="replay", replay_trace=str(backwards)))


def test_a_replay_of_a_replay_offers_the_first_recording(db):
    store = open_store(db)
    first = execute(RunConfig(**CLIFF, load="poisson", sessions=8, arrival_rate=2.0), store)
    second = execute(_replay(db, first, policy="window", window=64), store)
    third = execute(_replay(db, second), store)  # unbounded again, same as the first
    assert _rows(store, third["run_id"]) == _rows(store, first["run_id"])


def test_an_archived_run_replays_from_its_parquet_files(db):
    from store import archive

    store = open_store(db)
    original = execute(RunConfig(**CLIFF, load="ramp", sessions=6), store)
    (moved,) = [archive.archive_run(store, original["run_id"])]
    assert moved.status == "archived"
    assert queries.run_row(store.cursor(), original["run_id"]) is None
    replay = execute(_replay(db, original), store)
    assert replay["sessions_offered"] == 6
    con = archive.open_archived(db, original["run_id"])
    try:
        archived_rows = con.execute(ROWS, [original["run_id"]]).fetchall()
    finally:
        con.close()
    assert _rows(store, replay["run_id"]) == archived_rows
