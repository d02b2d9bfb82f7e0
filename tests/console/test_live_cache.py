"""The Live page's per-viewer cache is bounded: entries and bytes, least recently used first."""

import pandas as pd
import pytest

from services import live_data
from console import views
from console.live_cache import MAX_BYTES, MAX_ENTRIES, LiveCache
from runtime import RunConfig, execute
from store.queries import run_row


def _entry(rows: int):
    frames = pd.DataFrame({"t": range(rows), "p95_ms": [1.0] * rows})
    return live_data._Settled(float("inf"), frames, pd.DataFrame())


def test_the_bound_is_in_the_code_and_modest():
    assert 1 <= MAX_ENTRIES <= 8 and MAX_BYTES <= 128 * 2**20


def test_least_recently_used_runs_go_first():
    cache = LiveCache(max_entries=2)
    cache["a"] = _entry(10)
    cache["b"] = _entry(10)
    assert cache.get("a") is not None  # a is now the most recent
    cache["c"] = _entry(10)
    assert "a" in cache and "c" in cache and "b" not in cache and len(cache) == 2


def test_bytes_are_bounded_and_a_huge_run_is_not_kept():
    one = _entry(10_000)
    size = int(one.frames.memory_usage(index=True, deep=True).sum())
    cache = LiveCache(max_entries=10, max_bytes=int(size * 2.5))
    for key in "abcd":
        cache[key] = _entry(10_000)
        assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 2
    cache["huge"] = _entry(100_000)  # larger than the whole budget
    assert "huge" not in cache and cache.nbytes <= cache.max_bytes


def test_many_runs_viewed_keep_at_most_the_bound(store):
    """Ten finished runs viewed one after another through live_data: the cache holds at most
    MAX_ENTRIES of them, and a cached refresh equals a fresh scan."""
    cur = store.cursor()
    cache = LiveCache()
    run_ids = [execute(RunConfig(engine="twin", sessions=2, duration_s=1.0, seed=i),
                       store)["run_id"] for i in range(MAX_ENTRIES + 3)]
    for run_id in run_ids:
        views.live_data(cur, run_row(cur, run_id), cache)
    assert len(cache) == MAX_ENTRIES
    last = run_row(cur, run_ids[-1])
    pd.testing.assert_frame_equal(views.live_data(cur, last, cache).frames,
                                  views.live_data(cur, last).frames)


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="must be ≥ 1"):
        LiveCache(max_entries=0)
