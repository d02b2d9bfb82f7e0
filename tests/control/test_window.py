"""The control sample (control/window.py): what a Limit sees of the frames, per interval and
over a sliding window."""

import math

import pytest

from control.limits import AIMDConfig, AIMDLimit
from control.window import MAX_SILENT_SHARE, WindowedLimit, window_intervals
from runtime import RunConfig


def _recording(**kw):
    inner = AIMDLimit(AIMDConfig(initial=4, max_limit=10), budget_ms=100)
    seen = []
    inner.on_sample = lambda now, lat, inflight, dropped: seen.append((now, lat, dropped))
    return WindowedLimit(lambda: inner, interval_s=1.0, min_samples=5, **kw), seen


def test_windowed_limit_feeds_one_p95_per_interval_with_a_minimum_count():
    win, seen = _recording()
    for i in range(20):  # 20 frames in 0.95 s: interval not over yet
        win.add(i * 0.05, float(i), silent=False)
    assert not win.maybe_sample(0.95, inflight=4) and seen == []
    assert win.maybe_sample(1.0, inflight=4)
    assert seen[0][0] == 1.0 and math.isclose(seen[0][1], 18.05) and not seen[0][2]
    win.add(1.1, 5.0, silent=False)  # too few, no drop: skipped
    assert not win.maybe_sample(2.1, inflight=4) and len(seen) == 1
    win.add(2.2, 5.0, silent=True)  # too few, but a silent frame always counts
    assert win.maybe_sample(3.3, inflight=4) and seen[1][2] is True


def _interval(win, start, frames=100, slow=0, silent=0, fast_ms=30.0, slow_ms=90.0, live=8):
    """One second of frames: `slow` of them at slow_ms, `silent` of those silent."""
    for i in range(frames):
        late = i < slow
        win.add(start + i / frames, slow_ms if late else fast_ms, silent=late and i < silent)
    return win.maybe_sample(start + 1.0, inflight=live)


def test_one_slow_tick_moves_a_one_interval_p95_but_not_a_three_interval_one():
    # 80 ms frames: a tick is 8 % of a 1 s interval's frames and 2.7 % of a 3 s window's.
    one, seen_one = _recording()
    three, seen_three = _recording(window_intervals=3)
    for win in (one, three):
        _interval(win, 0.0)
        _interval(win, 1.0)
        _interval(win, 2.0, slow=8)
    assert seen_one[-1][1] == 90.0  # the slow tick is the interval's p95
    assert seen_three[-1][1] == 30.0  # 8 of 300 frames: under the window's 5 %


def test_a_sustained_overload_shows_within_one_interval_and_leaves_with_the_window():
    win, seen = _recording(window_intervals=3)
    for k in range(3):
        _interval(win, float(k))
    _interval(win, 3.0, slow=100)  # every frame of the newest interval over
    assert seen[-1][1] == 90.0  # a third of the window over: its p95 at once
    for k in range(4, 7):
        _interval(win, float(k))
    assert [lat for _, lat, _ in seen[-3:]] == [90.0, 90.0, 30.0]  # gone after 3 intervals


def test_a_drop_is_more_silent_frames_than_the_share_n_c_is_judged_by():
    shared, seen_shared = _recording(window_intervals=3, max_silent_share=MAX_SILENT_SHARE)
    strict, seen_strict = _recording(window_intervals=3)
    for win in (shared, strict):
        _interval(win, 0.0, slow=2, silent=2)  # 2 of 100 silent: 2 %
        _interval(win, 1.0)  # 2 of 200: 1 %, not over it
        _interval(win, 2.0, slow=1, silent=1)  # 3 of 300: 1 %
        _interval(win, 3.0, slow=3, silent=3)  # 4 of 300 (the first interval left)
    assert [d for *_, d in seen_shared] == [True, False, False, True]
    assert all(d for *_, d in seen_strict)  # share 0: any silent frame in the window


def test_window_arguments_are_validated_and_a_run_builds_its_own():
    with pytest.raises(ValueError, match="control window of 0 intervals"):
        _recording(window_intervals=0)
    with pytest.raises(ValueError, match="silent share 1.0"):
        _recording(max_silent_share=1.0)
    with pytest.raises(ValueError, match="control window -1 s"):
        RunConfig(engine="twin", control_window_s=-1)
    win = RunConfig(engine="twin", control_interval_s=0.5).windowed_limit(
        lambda: AIMDLimit(AIMDConfig(), budget_ms=80))
    assert win._closed.maxlen == 6 and win.max_silent_share == MAX_SILENT_SHARE


def test_one_cut_per_window_then_a_whole_window_of_frames_after_it():
    limit = AIMDLimit(AIMDConfig(initial=10, max_limit=20, target_fraction=0.5), budget_ms=100)
    win = WindowedLimit(lambda: limit, interval_s=1.0, min_samples=5, window_intervals=3)
    _interval(win, 0.0)
    assert _interval(win, 1.0, slow=100)  # over the 50 ms target: cut to ⌊0.9 · 8⌋
    assert limit.limit == 7 and win.last_p95_ms == 90.0
    # Live stays at or over the cap: no sample (nothing to admit) until the window has refilled.
    assert not _interval(win, 2.0, slow=100, live=8)
    assert not _interval(win, 3.0, slow=100, live=7)
    assert limit.limit == 7
    assert _interval(win, 4.0, live=7)  # a whole window after the cut, two thirds over it
    assert win.last_p95_ms == 90.0 and limit.limit == 6  # the second cut
    for k in range(5, 8):
        _interval(win, float(k), live=6)
    assert win.last_p95_ms == 30.0 and limit.limit >= 6  # back to live once the window is clean


def test_while_held_sessions_that_leave_let_the_frames_since_the_cut_decide():
    limit = AIMDLimit(AIMDConfig(initial=10, max_limit=20, target_fraction=0.5), budget_ms=100)
    win = WindowedLimit(lambda: limit, interval_s=1.0, min_samples=5, window_intervals=3)
    _interval(win, 0.0)
    _interval(win, 1.0, slow=100)
    assert limit.limit == 7
    # Two sessions leave: the cap of 7 would admit again, so the second over the target since
    # the cut is a sample, and the cap follows live down instead of admitting into it.
    assert _interval(win, 2.0, slow=100, live=6)
    assert limit.limit == 5 and win.last_p95_ms == 90.0
    # Another leaves and the frames since this cut are at the target: admit again at once.
    assert _interval(win, 3.0, live=4)
    assert win.last_p95_ms == 30.0 and limit.limit >= 5


def test_a_window_holds_at_least_36_ticks_at_any_frame_period():
    # 3 s at 80 ms (37.5 ticks), the period the defaults were tuned at; at 160 ms 3 s is only
    # 19 ticks, so the window grows to 6 s; a longer window asked for is kept.
    assert window_intervals(3.0, 1.0, 0.08) == 3
    assert window_intervals(3.0, 1.0, 0.16) == 6
    assert window_intervals(3.0, 1.0, 1.0) == 36
    assert window_intervals(10.0, 1.0, 0.08) == 10
    assert window_intervals(3.0, 0.5, 0.16) == 12
    for frame_ms, seconds in ((80, 3.0), (160, 6.0)):
        intervals = RunConfig(engine="twin", frame_ms=frame_ms).windowed_limit(
            lambda: AIMDLimit(AIMDConfig(), budget_ms=frame_ms))._closed.maxlen
        assert intervals == seconds  # 1 s intervals
