"""Issue 12 on real vLLM (tiny model, CPU): scripted live changes are on the record and the
pool follows them; rollover with sinks keeps the sinks; a slope run's latency is numeric."""

import json

import pytest

from runtime import RunConfig, Runner
from runtime.config import ScheduledChange
from store.queries import events, frame_counts

pytestmark = pytest.mark.vllm

# max_model_len 512: 19 KV tokens a frame, so each session rolls over about every 25 frames
# (4 s at 160 ms). Written for 160 ms frames; a machine that cannot serve 6 sessions at half its
# N_c there runs the same frames at a longer period (tests/vllm_machine.py): times scale by K.
LOAD = dict(engine="vllm", model="tiny", policy="window", window=128, sinks=32, pool_blocks=96,
            sessions=6, frame_ms=160.0, duration_s=10.0, max_model_len=512)
K = 1.0


@pytest.fixture(scope="module")
def engine(vllm_machine, vllm_engines):
    global K
    frame_ms = vllm_machine.frame_ms_for(LOAD["sessions"], at_least_ms=160.0)
    K = frame_ms / 160.0
    LOAD.update(frame_ms=frame_ms, duration_s=10.0 * K)
    return vllm_engines.get(RunConfig(**LOAD))


def test_scripted_changes_roll_over_with_sinks_and_bound_the_pool(engine, store):
    cfg = RunConfig(**LOAD, changes=(ScheduledChange.parse(f"{6 * K:g}:sinks=0"),
                                     ScheduledChange.parse(f"{6.5 * K:g}:window=32")))
    frame_s = LOAD["frame_ms"] / 1e3
    s = Runner(cfg, engine, store).run()
    assert s.status == "finished", s.reason
    # The changes are history: in order, with their times, and the JSON ends at W = 32.
    assert [c["change"] for c in s.changes] == ["S 32 → 0", "W 128 → 32"]
    # Requested at the first tick at or after its time, confirmed by the engine a tick or two
    # later (the tick does not wait for it): on the record at the tick that saw it done.
    assert 6.0 * K <= s.changes[0]["t"] < 6.0 * K + 3 * frame_s
    assert 6.5 * K <= s.changes[1]["t"] < 6.5 * K + 3 * frame_s
    assert (s.window, s.sinks) == (32, 0)
    assert s.settings_at_start["window"] == 128
    hist = store.cursor().execute(
        "SELECT setting, window_tokens, sink_tokens FROM settings_history WHERE run_id = ? "
        "ORDER BY t", [s.run_id]).fetchall()
    assert hist == [("start", 128, 32), ("policy", 128, 0), ("policy", 32, 0)]
    # Occupancy falls under the new bound: per session ceil(32/32) + 1 + 1 blocks (a frame's
    # 19 tokens may straddle a block edge), within a second of the change.
    used = store.cursor().execute(
        "SELECT max(used_blocks) FROM ticks WHERE run_id = ? AND t > ?",
        [s.run_id, 7.5 * K]).fetchone()[0]
    assert used <= 6 * 3, used
    # Sessions rolled over before max_model_len with the sinks + the last W as their prompt.
    ev = events(store.cursor(), s.run_id)
    rolls = [json.loads(d) for d in ev[ev.kind == "rollover"].detail]
    assert rolls, "no rollover in 62 frames at 512 tokens"
    early = [r for r in rolls if r["sink_tokens"] == 32]  # the first ones, at about 4.3 s
    assert early and all(r["prompt_tokens"] == 32 + 128 for r in early)
    assert not (ev.kind == "close").any()  # no session error from a rollover
    # A bounded run keeps answering: a numeric median, no stall. On an AVX2-only 2-core EPYC a
    # rollover's 160-token prefill holds frames past the next one (censored: 12 and 50 of ~370
    # seen in two suite runs), so the bound is structural — a stall censors every frame after it.
    assert not s.stalled and s.censored_frames <= 0.2 * s.frames, s.censored_frames
    assert not s.p50_censored and s.p50_ms is not None
    assert frame_counts(store.cursor(), s.run_id)["frames"] == s.frames


def test_the_tick_keeps_submitting_frames_while_a_change_is_applied(engine, store):
    cfg = RunConfig(**{**LOAD, "duration_s": 6.0 * K, "max_model_len": None},
                    changes=(ScheduledChange.parse(f"{2 * K:g}:window=64"),
                             ScheduledChange.parse(f"{4 * K:g}:window=128")))
    frame_s = LOAD["frame_ms"] / 1e3
    s = Runner(cfg, engine, store).run()
    ev = events(store.cursor(), s.run_id)
    changes = [(t, json.loads(d)) for t, d in zip(ev.t, ev.detail)
               if json.loads(d).get("setting") == "policy"]
    changes = [(t, d) for t, d in changes if "requested_t" in d]
    assert len(changes) == 2
    frames = store.cursor().execute(
        "SELECT session_id, t_submit, skipped FROM frames WHERE run_id = ? ORDER BY t_submit",
        [s.run_id]).df()
    for seen_t, detail in changes:
        # From the request to one frame after the tick that saw it done, every session kept
        # its cadence: frames (submitted, or skipped while the previous one was owed) no more
        # than 1.5 frames apart. A run thread waiting on the engine would leave a gap as long
        # as the change. A skip is the engine behind, not the tick: on an AVX2-only 2-core
        # EPYC one frame of ~40 was skipped across a change, so the bound is one per session.
        lo, hi = detail["requested_t"] - frame_s, seen_t + frame_s
        during = frames[(frames.t_submit >= lo) & (frames.t_submit <= hi)]
        assert during.groupby("session_id").skipped.sum().max() <= 1, during[during.skipped]
        for _, per_session in during.groupby("session_id"):
            gaps = per_session.t_submit.diff().dropna()
            assert (gaps <= 1.5 * frame_s).all(), (detail, gaps.max())
        assert detail["confirm_ms"] < 2000  # the engine answered; the tick did not wait for it
