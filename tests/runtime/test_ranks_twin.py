"""Data parallelism on the twin: the engine-wide pool reads under 0.6 while one rank is full and
silent; Metronome names the rank, and headroom placement avoids the stall under the same load."""

import json

import pytest

from runtime import RunConfig, execute
from runtime.run_summary import RankSummary
from store.queries import occupancy
from store.rank_queries import rank_occupancy, rank_stalls

POOL = 64  # blocks per rank: one unbounded session (19 tokens a frame) fills it in 8.6 s


def _skew_trace(path):
    """A long session A (0–7.5 s), a stream of short ones (0.5 s, one at a time), two shorts
    overlapping at 4.85 s, then a second long session C (5–10 s). Counting sessions puts C
    beside A, on the rank whose pool A has half filled; the other rank holds only shorts."""
    rows = [(0.0, 7.5), (0.01, 0.51)]
    rows += [(0.01 + 0.7 * j, 0.51 + 0.7 * j) for j in range(1, 7)]
    rows += [(4.85, 5.35), (4.9, 5.4), (5.0, 10.0)]
    rows += [(5.6 + 0.7 * j, 6.1 + 0.7 * j) for j in range(6)]
    path.write_text("session_id,start_s,end_s,tokens_in,tokens_out\n" + "".join(
        f"{i},{a},{b},16,4\n" for i, (a, b) in enumerate(rows)))
    return str(path)


def _run(store, trace, placement, **kw):
    return execute(RunConfig(engine="twin", pool_blocks=POOL, duration_s=10.0, load="replay",
                             replay_trace=trace, data_parallel_size=2, placement=placement,
                             **kw), store)


@pytest.mark.parametrize("placement", ["count", "engine"])
def test_one_rank_stalls_while_the_mean_reads_under_0_6(store, tmp_path, placement):
    s = _run(store, _skew_trace(tmp_path / "skew.csv"), placement)
    cur = store.cursor()
    assert occupancy(cur, s.run_id).occupancy.max() < 0.6  # the engine-wide pool
    assert s.stalled and s.stalled_rank == 0 and s.silence == "stall"
    r0, r1 = s.ranks
    assert r0.stalled and r0.max_occupancy == 1.0 and r0.silent_frames > 10
    assert not r1.stalled and r1.silent_frames == 0 and r1.max_occupancy < 0.2
    assert s.stall_at_s == r0.stall_at_s and 6 < s.stall_at_s < 7.5
    assert s.data_parallel_size == 2 and s.placement == placement
    stall = cur.execute("SELECT detail FROM events WHERE run_id = ? AND kind = 'stall'",
                        [s.run_id]).fetchall()
    assert [json.loads(d)["rank"] for (d,) in stall] == [0]
    # Stored with the rank: the tick rows, and each silent frame on the stalled rank.
    stalls = rank_stalls(cur, s.run_id)
    assert stalls.stall_at_s.isna().tolist() == [False, True]
    assert stalls.silent_frames.tolist() == [r0.silent_frames, 0]
    silent_ranks = cur.execute("SELECT DISTINCT rank FROM frames WHERE run_id = ? AND silent",
                               [s.run_id]).fetchall()
    assert silent_ranks == [(0,)]
    ranks = rank_occupancy(cur, s.run_id)
    assert set(ranks["rank"]) == {0, 1} and ranks[ranks.stalled]["rank"].eq(0).all()


def test_headroom_placement_avoids_the_stall_under_the_same_load(store, tmp_path):
    s = _run(store, _skew_trace(tmp_path / "skew.csv"), "headroom")
    assert not s.stalled and s.stalled_rank is None and s.silent_frames == 0
    assert all(r.max_occupancy < 0.9 for r in s.ranks)


def test_the_stall_guard_evicts_on_the_stalled_rank(store, tmp_path):
    s = _run(store, _skew_trace(tmp_path / "skew.csv"), "count", stall_guard=True)
    evicts = store.cursor().execute(
        "SELECT detail FROM events WHERE run_id = ? AND kind = 'evict'", [s.run_id]).fetchall()
    assert evicts and {json.loads(d)["rank"] for (d,) in evicts} == {0}
    assert s.ranks[1].silent_frames == 0


def test_the_memory_guard_weighs_the_rank_the_session_would_join(store, tmp_path):
    # C would join rank 0 (A has half filled it): refused there, though the engine-wide pool
    # reads under 0.3 when C arrives.
    s = _run(store, _skew_trace(tmp_path / "skew.csv"), "count", memory_guard=True)
    rejects = [json.loads(d) for (d,) in store.cursor().execute(
        "SELECT detail FROM events WHERE run_id = ? AND kind = 'reject'",
        [s.run_id]).fetchall()]
    assert rejects and all(r["reason"] == "memory_guard" for r in rejects)
    assert rejects[0]["rank"] == 0 and not s.stalled


def test_one_rank_reads_as_before(store):
    s = execute(RunConfig(engine="twin", pool_blocks=64, sessions=12, duration_s=5.0), store)
    assert s.data_parallel_size == 1 and s.placement == "engine"
    assert s.ranks == (RankSummary(0, s.max_occupancy, s.stalled, s.stall_at_s, s.frames,
                                   s.silent_frames),)
    assert s.stalled_rank == (0 if s.stalled else None)
    assert rank_occupancy(store.cursor(), s.run_id).empty  # no rank rows for one pool


def test_placement_is_validated():
    with pytest.raises(ValueError, match="placement 'least' is not one of engine, count, "
                                         "headroom"):
        RunConfig(engine="twin", placement="least")
