"""The Live view reads rollups, not frames: for a twin run it shows the same frame counts,
silent frames, misses, session wall, tick buckets and marks as the exact queries over the raw
rows; its chart buckets are always sizes a rollup level divides."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from services import live_data as ld
from runtime import RunConfig, execute
from store import queries, rollup_build, rollup_queries
from store.rollups import LEVELS


@pytest.mark.parametrize("span_s", [0, 1, 299, 300, 301, 1500, 1501, 9000, 36000, 125000,
                                    1e6])
def test_chart_buckets_are_divided_by_a_rollup_level_and_stay_few(span_s):
    bucket = ld.bucket_for(span_s)
    assert bucket == int(bucket) and rollup_queries.level_for(bucket) in LEVELS
    assert span_s / bucket <= ld.MAX_BUCKETS
    assert bucket / rollup_queries.level_for(bucket) <= 5  # rollup rows read per point


def test_a_chart_bucket_no_level_divides_is_refused():
    with pytest.raises(ValueError, match="whole number"):
        rollup_queries.level_for(2.5)


@pytest.mark.parametrize("policy", ["unbounded", "window"])
def test_live_data_from_rollups_equals_the_raw_frames(store, policy):
    window = 64 if policy == "window" else None
    s = execute(RunConfig(engine="twin", sessions=12, pool_blocks=96, policy=policy,
                          window=window, duration_s=12.0, seed=3), store)
    cur = store.cursor()
    row = queries.run_row(cur, s["run_id"])
    data = ld.live_data(cur, row)
    bucket = data.bucket_s
    raw = queries.frame_buckets(cur, s["run_id"], bucket)
    assert int(data.frames.frames.sum()) == s["frames"] == int(raw.frames.sum())
    for name in ("frames", "censored"):
        assert list(data.frames[name]) == list(raw[name]), name
    for name in ("silent_per_s", "miss_rate", "naive_miss_rate"):
        np.testing.assert_allclose(data.frames[name], raw[name], err_msg=name)
    silent = data.frames.silent_per_s.sum() * bucket
    assert round(silent) == s["silent_frames"] == queries.frame_counts(
        cur, s["run_id"])["silent_frames"]
    for name in ("p50_ms", "p95_ms", "naive_p95_ms"):
        for want, got in zip(raw[name], data.frames[name]):
            assert math.isinf(want) == math.isinf(got) and (
                math.isinf(want) or want <= got < want * 1.0500001), (name, want, got)
    pd.testing.assert_frame_equal(data.wall, queries.session_wall(cur, s["run_id"], bucket),
                                  check_dtype=False)
    pd.testing.assert_frame_equal(data.ticks, queries.tick_buckets(cur, s["run_id"], bucket),
                                  check_dtype=False)
    pd.testing.assert_frame_equal(data.marks.stalls, queries.stall_spans(cur, s["run_id"]))
    assert data.marks.tsat == queries.tsat_prediction(cur, s["run_id"])
    assert data.tick["t"] == queries.latest_tick(cur, s["run_id"])["t"]
    assert set(rollup_build.differences(cur, s["run_id"]).values()) == {0}
    if policy == "unbounded":
        assert s["stalled"] and not data.marks.stalls.empty  # the marks were exercised


def test_the_live_page_rolls_up_a_run_from_before_rollups_once_with_progress(db, monkeypatch):
    from store import open_store
    from store.schema import ROLLUP_TABLES as TABLES
    from tests.console.conftest import charts_by_title, finished_twin_run, page

    run_id = finished_twin_run(db)
    store = open_store(db)
    for table in TABLES:  # as a file written before rollups existed holds the run
        store.writer.call(lambda con, table=table: con.execute(f"DELETE FROM {table}"))
    monkeypatch.setattr(rollup_build, "_known", set())
    shown = []
    ensure = rollup_build.ensure
    monkeypatch.setattr(rollup_build, "ensure", lambda s, r, progress=None: ensure(
        s, r, lambda f: (shown.append(f), progress(f))))
    at = page()
    assert not at.exception and not at.error
    assert shown and shown[-1] == 1.0  # the page's progress bar was driven to the end
    assert rollup_build.rolled_up(store.cursor(), run_id)
    assert charts_by_title(at)["Frame latency vs budget"][0] > 0
    shown.clear()
    page()
    assert shown == []  # once
