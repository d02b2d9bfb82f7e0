"""Calibration, the demo derived from it, and its story: on the twin (simulated), whose speed is
its cost model, so a "slower machine" is a twin with a costlier step."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from services import calibration
from services import demo
from services import story
from engine.twin import CostModel, TwinEngine
from runtime import RunConfig, Runner, RunSummary
from store import Store

ROOT = Path(__file__).resolve().parents[2]
FAST = CostModel(2.0, 0.025, 0.00025, source="fast")
SLOW = CostModel(8.0, 0.1, 0.001, source="slow")


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "demo.duckdb"))
    yield s
    s.close()


def _run_pair(settings: demo.DemoSettings, cost: CostModel, store) -> list[dict]:
    out = []
    for config in settings.configs("twin", "tiny"):
        out.append(Runner(config, TwinEngine(config.engine_config(), cost), store).run())
    store.writer.flush()
    return out


def _assert_cliff_and_slope(cliff: RunSummary, slope: RunSummary, store) -> None:
    assert cliff.stalled, cliff
    after = story.silent_after_stall(store.cursor(), cliff)
    assert after is not None and after >= 0.5, after
    assert not slope.stalled and slope.silent_rate <= 0.01, slope


def test_derived_settings_move_with_the_machine_and_both_show_a_cliff_and_a_slope(store):
    fast = calibration.calibrate("twin", "tiny", store, cost=FAST)
    slow = calibration.calibrate("twin", "tiny", store, cost=SLOW)
    assert slow.n_c < fast.n_c
    # the fitted step cost recovers the twin's (a is the fixed cost of a step)
    assert slow.a_ms == pytest.approx(SLOW.a_ms, rel=0.1)
    assert fast.a_ms == pytest.approx(FAST.a_ms, rel=0.1)
    fast_demo, slow_demo = demo.derive(fast), demo.derive(slow)
    assert slow_demo.sessions < fast_demo.sessions
    assert slow_demo.pool_blocks < fast_demo.pool_blocks
    for settings, cost in ((fast_demo, FAST), (slow_demo, SLOW)):
        assert settings.sessions <= 0.5 * settings.n_c
        assert settings.predicted_t_sat_s == pytest.approx(settings.duration_s / 3, rel=0.05)
        _assert_cliff_and_slope(*_run_pair(settings, cost, store), store)


class _AudioInTwin(TwinEngine):
    """The twin standing in for an audio-in engine: its frame ids are fixed at start, one
    audio token per 40 ms between two markers, as a processor's are (4 at 80 ms, 6 at 160)."""

    def __init__(self, config):
        super().__init__(config.engine_config(), SLOW)
        self.frame_token_ids = (1,) + (2,) * round(config.frame_ms / 40) + (3,)


def test_an_audio_in_model_is_calibrated_at_its_own_frames_with_an_engine_per_period():
    started = []

    def factory(config):
        started.append((config.frame_ms, config.tokens_in))
        return _AudioInTwin(config)

    cal = calibration.calibrate("twin", "audio-tiny", None, engine_factory=factory,
                                periods_ms=(80.0, 160.0), tokens_in=16)
    # A new engine for 160 ms (its encoder window is one frame), and each period probed at
    # what the processor makes of its frame, not the 16 asked for.
    assert [f for f, _ in started] == [80.0, 160.0]
    assert cal.tokens_in == 6 and [f for f, _ in cal.periods] == [80.0, 160.0]
    assert {p[4] for p in cal.probes} == {80.0, 160.0}
    text = calibration.calibrate("twin", "tiny", None, cost=SLOW, periods_ms=(160.0,),
                                 tokens_in=6)
    assert text.tokens_in == 6 and [f for f, _ in text.periods] == [160.0]
    with pytest.raises(ValueError, match="periods"):
        calibration.calibrate("twin", "tiny", None, cost=SLOW, periods_ms=(20.0,))


def test_the_load_moves_n_c_not_the_other_way_round():
    """N_c is measured: a probe within target is never reported over the limit."""
    cal = calibration.calibrate("twin", "tiny", None, cost=SLOW)
    assert [f for f, _ in cal.periods] == [80.0]  # the twin serves ≥ 4 at 80 ms
    ok = [n for n, _, _, within, _ in cal.probes if within]
    over = [n for n, _, _, within, _ in cal.probes if not within]
    assert cal.n_c == max(ok) and min(over) > cal.n_c
    assert min(over) - cal.n_c <= max(1, round(0.1 * cal.n_c))  # bracketed within 10 %
    assert len(cal.probes) <= calibration.MAX_PROBES + calibration.MAX_CONFIRMS
    # the load reported was probed again (the twin is steady: it passed again)
    assert cal.probes[-1][0] == cal.n_c and cal.probes[-1][3]
    assert [n for n, *_ in cal.probes].count(cal.n_c) == 2


def _scripted_search(monkeypatch, verdicts):
    """A search whose probes answer from `verdicts` (n → list of answers, popped; when none is
    left, n ≤ 10 holds); returns the search and the probes asked, (n, confirm, ok)."""
    monkeypatch.setattr(calibration, "fit_cost_model", lambda steps, source: (None, {}))
    monkeypatch.setattr(calibration, "analytic_n_star", lambda *args: 12)
    asked = []

    def probe(frame_ms, n, found, max_probes, confirm=False):
        ok = verdicts[n].pop(0) if verdicts.get(n) else n <= 10
        asked.append((n, confirm, ok))
        found[n] = (n, 50.0, 0.0, ok)
        return ok

    search = calibration._Search(calibration.probe_base("twin", "tiny"), None, None, None)
    search._probe = probe
    return search, asked


def test_a_load_that_passes_once_by_luck_is_not_n_c(monkeypatch):
    """Near the limit a short probe passes or fails by noise, and a bisection keeps the largest
    load that passed once: the load found is probed again, longer, and one that fails then is
    over the limit; the next confirm is 10 % under it."""
    search, asked = _scripted_search(monkeypatch, {11: [True, False], 12: [True, False]})
    try:
        n_c, _ = search.n_c_at(80.0, calibration.MAX_PROBES)
    finally:
        search.close()
    # 2 and 12 pass, 18, 15 and 13 are over; 12 probed again, for the confirm's length, fails
    assert asked[:6] == [(2, False, True), (12, False, True), (18, False, False),
                         (15, False, False), (13, False, False), (12, True, False)]
    # then 10 (⌊0.9 · 12⌋), confirmed at once: no new bisection from the last short pass
    assert asked[6:] == [(10, True, True)] and n_c == 10


def test_confirms_step_down_a_tenth_at_a_time_and_stop_after_their_limit(monkeypatch):
    search, asked = _scripted_search(monkeypatch, {12: [True, False], 10: [False],
                                                   9: [False], 8: [False]})
    try:
        n_c, _ = search.n_c_at(80.0, calibration.MAX_PROBES)
    finally:
        search.close()
    confirms = [(n, ok) for n, confirm, ok in asked if confirm]
    assert confirms == [(12, False), (10, False), (9, False)]  # MAX_CONFIRMS of them
    assert n_c == 8  # the next step under the last that failed, unconfirmed (logged)


def test_a_confirm_lasts_its_ticks_at_every_period(monkeypatch):
    """The confirm lasts CONFIRM_TICKS ticks at any period, so a longer period is judged over
    as many ticks as the 80 ms one, not over the same seconds."""
    durations = []
    monkeypatch.setattr(calibration, "execute", lambda config, store, eng: (
        durations.append(config.duration_s) or RunSummary("x", "finished", p95_ms=1.0,
                                                           silent_rate=0.0)))
    monkeypatch.setattr(calibration.queries, "steps", lambda cur, run_id: [])
    search = calibration._Search(calibration.probe_base("vllm", "tiny"), None,
                                 lambda fraction, text: None, None)
    try:
        for frame_ms in (80.0, 160.0):
            assert search._probe(frame_ms, 3, {}, 4) and search._probe(frame_ms, 3, {}, 4,
                                                                        confirm=True)
    finally:
        search.close()
    assert durations == [3.0, 8.0, 3.84, 16.0]


def test_a_calibration_is_kept_per_engine_model_dtype_and_machine_and_reused(store):
    first = calibration.ensure(store, "twin", "tiny")
    again = calibration.ensure(store, "twin", "tiny")
    assert again == first  # read back, not measured again
    assert calibration.stored(store.cursor(), "vllm", "tiny") is None
    assert calibration.stored(store.cursor(), "twin", "smollm2") is None
    assert "simulated · cost default" in first.machine and first.dtype == "simulated"
    # the same machine in another dtype is another calibration
    calibrations_row = {**first.as_row(), "dtype": "bfloat16", "n_c": 1}
    store.writer.add("calibrations", calibrations_row)
    store.writer.flush()
    assert calibration.stored(store.cursor(), "twin", "tiny") == first
    # a refitted twin is another "machine": its calibration no longer applies
    store.writer.add("twin_models", {"fitted_at": first.calibrated_at, "source_run_id": "r1",
                                     "a_ms": 8.0, "b_ms_per_token": 0.1,
                                     "c_ms_per_resident_token": 0.001, "r2": 1.0,
                                     "n_steps": 100})
    store.writer.flush()
    assert calibration.stored(store.cursor(), "twin", "tiny") is None


def test_calibration_reports_progress_and_can_be_stopped():
    seen = []

    def progress(fraction, text):
        seen.append((fraction, text))
        if len(seen) == 3:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        calibration.calibrate("twin", "tiny", None, progress=progress)
    assert seen[0] == (0.0, "starting the twin engine")
    assert "calibrating at 80 ms frames: 2 sessions → p95" in seen[1][1] \
        and 0 < seen[1][0] < 1


def _calibration(n_c: int, *longer: tuple[float, int]) -> calibration.Calibration:
    periods = ((80.0, n_c), *longer)
    return replace(calibration.calibrate("twin", "tiny", None), n_c=periods[-1][1],
                   frame_ms=periods[-1][0], target_ms=0.8 * periods[-1][0], periods=periods)


def test_derive_refuses_a_machine_that_cannot_serve_one_session():
    ladder = [(f, 0) for f in calibration.PERIODS_MS[1:]]
    with pytest.raises(ValueError, match="cannot serve one session at any frame period up to "
                                         "2000 ms .N_c: 0 at 80 ms, 0 at 160 ms"):
        demo.derive(_calibration(0, *ladder))
    with pytest.raises(ValueError, match="duration 1 s must be in"):
        demo.derive(_calibration(10), duration_s=1)


def test_the_demo_keeps_80_ms_where_it_serves_4_and_ticks_slower_where_not():
    kept = demo.choose_period(((80.0, 4),))
    assert (kept.frame_ms, kept.n_c) == (80.0, 4)
    assert kept.sentence == "this machine serves 4 sessions at 80 ms frames"
    slow = demo.choose_period(((80.0, 3), (160.0, 3), (320.0, 9)))
    assert (slow.frame_ms, slow.n_c) == (320.0, 9)
    assert slow.sentence.startswith("this machine serves 3 sessions at 80 ms frames; the demo "
                                    "ticks every 320 ms")
    # none reaches 4: the period serving the most, shortest first
    best = demo.choose_period(((80.0, 0), (160.0, 1), (320.0, 2), (640.0, 2), (1000.0, 1),
                               (2000.0, 1)))
    assert (best.frame_ms, best.n_c) == (320.0, 2)
    assert best.sentence.startswith("this machine cannot serve one session at 80 ms frames; "
                                    "the demo ticks every 320 ms (2 sessions)")
    assert demo.choose_period(((80.0, 1),)).sentence.endswith("serves 1 session at 80 ms frames")
    one = demo.choose_period(((80.0, 1), (160.0, 16)))
    assert one.sentence.startswith("this machine serves 1 session at 80 ms frames; the demo")
    settings = demo.derive(_calibration(3, (160.0, 3), (320.0, 9)))
    assert settings.frame_ms == 320.0 and settings.sessions == 4  # half of N_c there
    assert settings.duration_s == pytest.approx(demo.DURATION_S * 4)  # as many frames
    assert settings.predicted_t_sat_s == pytest.approx(settings.duration_s / 3, rel=0.05)
    assert "320 ms" in settings.period_note


def test_a_slow_twin_calibrates_at_a_longer_period_and_its_demo_still_shows_the_pair(store):
    """A machine whose 80 ms frames hold under 4 sessions: the ladder goes on to longer
    periods until one does, and the demo at that period shows a cliff and a clean slope."""
    crawl = CostModel(15.0, 0.2, 0.002, source="crawl")
    cal = calibration.calibrate("twin", "tiny", None, cost=crawl)
    assert cal.periods[0][0] == 80.0 and cal.periods[0][1] < calibration.DEMO_MIN_SESSIONS
    assert cal.frame_ms > 80.0 and cal.n_c >= calibration.DEMO_MIN_SESSIONS
    settings = demo.derive(cal)
    assert settings.frame_ms == cal.frame_ms
    _assert_cliff_and_slope(*_run_pair(settings, crawl, store), store)


def test_hand_typed_settings_that_cannot_show_a_cliff_are_named():
    # The observation: Poisson 2/s of 6 s sessions never fill 352 blocks.
    observed = RunConfig(engine="twin", load="poisson", sessions=30, arrival_rate=2.0,
                         session_s=6.0, duration_s=15.0, pool_blocks=352)
    (problem,) = demo.cliff_problems(observed, 128, 0, n_c=20)
    assert "the pool never fills" in problem and "352" in problem
    # fixed load: t_sat beyond the run, over N_c, a window that does not fit
    fixed = RunConfig(engine="twin", sessions=12, pool_blocks=2048, duration_s=10.0)
    problems = demo.cliff_problems(fixed, 128, 0, n_c=8)
    assert any("beyond the run's 10 s" in p for p in problems)
    assert any("over this machine's compute limit N_c = 8" in p for p in problems)
    small = RunConfig(engine="twin", sessions=12, pool_blocks=48, duration_s=10.0)
    assert any("the window does not fit: 12 sessions × 5 blocks = 60" in p
               for p in demo.cliff_problems(small, 128, 0, n_c=None))
    derived = demo.derive(_calibration(12))
    assert demo.cliff_problems(derived.base("twin", "tiny"), derived.window, derived.sinks,
                               12) == []


def test_predicted_t_sat_matches_the_formula():
    # 6 sessions, 256 blocks of 32, 80 ms frames of 16 in / 4 out: 19 tokens per 80 ms each
    t = demo.predicted_t_sat_s(6, 256, 32, 16, 4, 80.0)
    rho0 = 6 / 256
    assert t == pytest.approx((1 - rho0) / (6 * 19 / 0.08 / (256 * 32)))


def test_story_sentences_read_without_engineering():
    stalled = RunSummary("r1", "finished", stalled=True, stall_at_s=6.34,
                         naive_on_time_rate=1.0, silent_rate=0.6, policy="unbounded")
    assert story.sentence(stalled, 0.98) == (
        "after 6.3 s the engine went silent for every session (98% of frames after that got "
        "no answer) while its dashboard still showed 100% on time")
    slope = RunSummary("r2", "finished", stalled=False, policy="window", window=128,
                       max_occupancy=0.4123, silent_frames=0, silence="none",
                       naive_on_time_rate=1.0)
    assert story.sentence(slope) == "occupancy levelled at 0.41 with W = 128, no silent frame"
    slow = replace(slope, silent_frames=30, silent_rate=0.05, silence="compute")
    assert "5.0% of frames silent (too slow for this machine" in story.sentence(slow)


def _cli(*args, db: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "cli.main", *args, "--db", db, "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_cli_demo_calibrates_once_then_reuses_it(tmp_path):
    db = str(tmp_path / "cli.duckdb")
    first = _cli("demo", "--engine", "twin", db=db)
    cliff, slope = first["runs"]
    assert (cliff["policy"], slope["policy"]) == ("unbounded", "window")
    assert cliff["stalled"] and first["silent_after_stall"][0] >= 0.5
    assert not slope["stalled"] and slope["silent_rate"] <= 0.01
    assert cliff["naive_on_time_rate"] >= 0.95  # the gateway's lie, visible
    assert first["story"].startswith(f"Same {first['settings']['sessions']} sessions")
    assert "went silent for every session" in first["story"]
    second = _cli("demo", "--engine", "twin", db=db)
    assert second["calibration"] == first["calibration"]
    cal = _cli("calibrate", "--engine", "twin", db=db)
    assert cal["calibrated_at"] >= first["calibration"]["calibrated_at"]
    assert cal["n_c"] == first["calibration"]["n_c"]  # the twin is deterministic
