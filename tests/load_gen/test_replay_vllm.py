"""Replay on real vLLM: a recorded unbounded cliff, replayed with a window, on two engines of
the session's pool (the policy kind is fixed per vLLM engine)."""

import pytest

from services.replay_settings import with_recorded_load
from runtime import RunConfig, Runner
from store import open_store

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

FRAME_MS = 160.0
DURATION_S = 6.0
CLIFF = dict(engine="vllm", model="tiny", policy="unbounded", pool_blocks=64, sessions=8,
             frame_ms=FRAME_MS, duration_s=DURATION_S, load="ramp", arrival_rate=20.0)


def test_windowed_replay_of_a_vllm_cliff_offers_the_same_frames_and_does_not_stall(
        tmp_path, vllm_engines):
    db = str(tmp_path / "replay.duckdb")
    store = open_store(db)

    def _run(config: RunConfig, store) -> dict:
        return Runner(config, vllm_engines.get(config), store).run()

    try:
        cliff = _run(RunConfig(**CLIFF), store)
        assert cliff["status"] == "finished", cliff["reason"]
        assert cliff["stalled"], cliff
        replay = RunConfig(**with_recorded_load({
            "engine": "vllm", "model": "tiny", "policy": "window", "window": 128,
            "pool_blocks": 64, "load": "replay", "replay_run": cliff["run_id"],
            "replay_db": db}))
        assert (replay.frame_ms, replay.sessions, replay.duration_s) == \
            (FRAME_MS, 8, DURATION_S)
        slope = _run(replay, store)
        assert slope["status"] == "finished", slope["reason"]
        assert not slope["stalled"], slope

        rows = ("SELECT session_id, frame_idx, t_submit FROM frames WHERE run_id = ? "
                "AND deadline <= ? ORDER BY 1, 2")
        cur = store.cursor()
        before = {(s, k): t for s, k, t in cur.execute(rows, [cliff["run_id"], DURATION_S])
                  .fetchall()}
        after = {(s, k): t for s, k, t in cur.execute(rows, [slope["run_id"], DURATION_S])
                 .fetchall()}
        print(f"cliff {cliff['run_id']}: {len(before)} frames, silent {cliff['silent_rate']}; "
              f"replay {slope['run_id']}: {len(after)} frames, silent {slope['silent_rate']}, "
              f"p95 {slope['p95_ms']} ms")
        assert {s for s, _ in after} == {s for s, _ in before} == set(range(8))
        # Every frame the cliff recorded was offered again at the same due time. t_submit is
        # the engine's clock at submission (a skipped frame's is its due time), so it may lag
        # the due time by the loop's own delay: within half a frame on two shared cores.
        assert set(before) <= set(after)
        late = max(abs(after[key] - before[key]) for key in before)
        assert late < FRAME_MS / 2 / 1e3, late
    finally:
        store.close()
