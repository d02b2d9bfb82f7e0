"""RunSummary: the store's JSON is today's (flat, same keys in the same order), a stored summary
reads back equal, and a row from before a field existed reads with that field's default."""

import json

from engine.twin import CostModel, TwinEngine
from runtime import RunConfig, Runner, RunSummary
from runtime.run_summary import AudioInput, RankSummary
from store.queries import run_row


def _run(store, **kw) -> RunSummary:
    cfg = RunConfig(engine="twin", duration_s=3.0, pool_blocks=96, **kw)
    summary = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store).run()
    store.writer.flush()
    return summary


def test_a_summary_round_trips_through_the_store(store):
    s = _run(store, policy="window", window=64, sessions=6, data_parallel_size=2)
    text = run_row(store.cursor(), s.run_id)["summary"]
    assert json.loads(text) == s.to_json()
    back = RunSummary.from_json(json.loads(text))
    assert back == s
    assert json.dumps(back.to_json()) == json.dumps(s.to_json())  # byte for byte, key order
    assert len(back.ranks) == 2 and isinstance(back.ranks[0], RankSummary)
    assert back.silent_by_cause == {"memory": s.silent_memory_frames,
                                    "compute": s.silent_compute_frames,
                                    "guard": s.silent_guard_frames,
                                    "other": s.silent_other_frames}


def test_the_json_is_flat_with_the_optional_groups_only_when_present():
    bare = RunSummary("r", "finished").to_json()
    assert not {"ranks", "stalled_rank", "data_parallel_size", "placement", "input_path",
                "input", "tokens_in_per_frame"} & set(bare)
    assert list(bare)[:3] == ["run_id", "status", "reason"] and list(bare)[-1] == "duration_s"
    audio = AudioInput(3, 10, 4, 10, 1.0, 3.0, 2.5)
    full = RunSummary("r", "finished", data_parallel_size=1, placement="engine",
                      input_path="audio encoder", input="wav audio", audio=audio).to_json()
    keys = list(full)
    # The audio counts sit flat after `input`, as runtime/inputs.py always wrote them.
    assert keys[keys.index("input") + 1:keys.index("input") + 8] == [
        "tokens_in_per_frame", "frames_submitted", "encoder_passes", "encoder_frames",
        "encoder_frames_per_frame", "audio_tokens_per_frame", "encoder_ms_per_frame"]
    assert full["ranks"] == [] and full["placement"] == "engine"
    assert RunSummary.from_json(full).audio == audio


def test_an_older_row_reads_with_defaults_and_unknown_keys_are_ignored():
    old = {"run_id": "old", "status": "finished", "frames": 100, "silent_frames": 5,
           "silent_rate": 0.05, "p95_ms": 42.0, "stalled": False, "stall_at_s": None,
           "changes": [{"t": 1.0, "setting": "window", "change": "W 64 → 32"}],
           "a_key_from_the_future": 1}
    s = RunSummary.from_json(old)
    assert (s.frames, s.silent_rate, s.p95_ms) == (100, 0.05, 42.0)
    # Counted later: a missing key is its field's default (None: not counted then).
    assert s.silent_memory_frames is None and None in s.silent_by_cause.values()
    # A count the row predates is unknown, not 0: late, censored and overrun counts alike.
    assert s.n_star is None and s.late_frames is None and s.censored_frames is None
    assert s.tick_overruns is None and s.partial_stall is None
    assert s.ranks == () and s.audio is None
    assert not s.ranked and s.changes[0]["change"] == "W 64 → 32"
    assert "a_key_from_the_future" not in s.to_json()
