"""Rollups (store/rollups.py): percentiles from the histograms within one bin of the exact
ones, counts equal to the frames', consistent with the frames on disk after a SIGKILL in the
middle of writing, and a run recorded before rollups rolled up once on first open."""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

from store import Store, archive, queries, rollup_build, rollup_marks, rollup_queries, rollups
from store.rollups import BIN_BASE_MS, BIN_RATIO
from store.schema import ROLLUP_TABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _random_frames(run_id: str, n: int, seed: int, sessions: int = 8) -> list[dict]:
    """Frames over ~40 s with log-normal latencies; per second a different share censored
    (0 to 40 %), some late, some with a NULL latency that is not censored (old files)."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 40, n))
    share = rng.uniform(0, 0.4, 41)[t.astype(int)]
    censored = rng.uniform(size=n) < share
    latency = np.exp(rng.normal(np.log(30), 0.6, n))
    rows = []
    for i in range(n):
        c = bool(censored[i])
        lat = None if c or rng.uniform() < 0.01 else float(latency[i])
        rows.append({
            "run_id": run_id, "session_id": int(i % sessions), "frame_idx": i,
            "t_submit": float(t[i]), "latency_ms": lat,
            "naive_latency_ms": 120.0 if c else (lat or 80.0), "tokens_out": 0 if c else 3,
            "tokens_expected": 3, "on_time": (not c) and lat is not None and lat <= 80,
            "naive_on_time": not c and (lat or 0) <= 80, "silent": c, "skipped": False,
            "complete": not c, "censored": c,
            "silent_cause": ("memory" if i % 2 else "compute") if c else None})
    return rows


def _bin(x: float) -> float:
    return math.inf if math.isinf(x) else math.ceil(math.log(x / BIN_BASE_MS) / math.log(BIN_RATIO))


@pytest.mark.parametrize("bucket_s", [1.0, 5.0, 20.0])
def test_histogram_percentiles_are_within_one_bin_of_the_exact_ones(store, bucket_s):
    store.writer.add_many("frames", _random_frames("p", 6000, seed=int(bucket_s)))
    store.writer.flush()
    cur = store.cursor()
    exact = queries.frame_buckets(cur, "p", bucket_s)
    rolled = rollup_queries.frame_buckets(cur, "p", bucket_s)
    assert list(rolled.t) == list(exact.t) and list(rolled.frames) == list(exact.frames)
    checked = censored = 0
    for name in ("p50_ms", "p95_ms", "p99_ms", "naive_p95_ms"):
        for want, got in zip(exact[name], rolled[name]):
            assert math.isinf(want) == math.isinf(got), (name, want, got)  # "> budget" alike
            censored += math.isinf(want)
            if not math.isinf(want):
                # never below the exact percentile, less than one bin ratio above it (so in
                # its bin or the next)
                assert want * (1 - 1e-12) <= got < want * BIN_RATIO * (1 + 1e-12), \
                    (name, want, got)
                assert 0 <= _bin(got) - _bin(want) <= 1, (name, want, got)
                checked += 1
    assert checked >= 2 * len(exact) and censored > 0  # both kinds of bucket were seen
    for name in ("censored", "silent_per_s", "miss_rate", "naive_miss_rate"):
        np.testing.assert_allclose(rolled[name].astype(float), exact[name].astype(float),
                                   err_msg=name)


def test_a_single_frame_bucket_and_an_all_censored_bucket(store):
    rows = _random_frames("s", 3, seed=1)
    rows[0].update(t_submit=0.5, latency_ms=12.0, censored=False, complete=True)
    for row in rows[1:]:
        row.update(t_submit=3.5, latency_ms=None, censored=True, complete=False, silent=True)
    store.writer.add_many("frames", rows)
    store.writer.flush()
    df = rollup_queries.frame_buckets(store.cursor(), "s", 1.0)
    assert list(df.frames) == [1, 2]
    assert 12.0 <= df.p50_ms[0] < 12.0 * BIN_RATIO and df.p99_ms[0] == df.p50_ms[0]
    assert math.isinf(df.p50_ms[1]) and math.isinf(df.p95_ms[1])


def test_walls_counts_and_windows_equal_the_frames(store):
    store.writer.add_many("frames", _random_frames("w", 5000, seed=7))
    store.writer.flush()
    cur = store.cursor()
    for bucket in (1.0, 2.0, 10.0, 30.0):
        pd.testing.assert_frame_equal(rollup_queries.session_wall(cur, "w", bucket),
                                      queries.session_wall(cur, "w", bucket), check_dtype=False)
    rng = np.random.default_rng(3)
    for lo, hi in [(0.0, None), (12.3, None), (3.5, 3.9), (7.0, 21.0)] + [
            tuple(sorted(rng.uniform(0, 41, 2))) for _ in range(10)]:
        assert rollup_marks.silent_share(cur, "w", lo, hi) == pytest.approx(
            queries.silent_share_after(cur, "w", lo, hi)), (lo, hi)


def test_compaction_merges_rows_without_changing_what_they_say(store):
    rows = _random_frames("c", 3000, seed=5)
    for i in range(0, 3000, 100):  # 30 batches, each touching the same coarse buckets
        store.writer.add_many("frames", rows[i:i + 100])
        store.writer.flush()
    cur = store.cursor()
    before = rollup_queries.frame_buckets(cur, "c", 10.0)
    n_before = cur.execute("SELECT count(*) FROM latency_rollups WHERE run_id = 'c' "
                           "AND level_s = 3600").fetchone()[0]
    store.writer.call(lambda con: rollups.compact(con, "c", 0.0))
    n_after, keys = cur.execute("SELECT count(*), count(DISTINCT bin) FROM latency_rollups "
                                "WHERE run_id = 'c' AND level_s = 3600").fetchone()
    assert n_after == keys < n_before
    pd.testing.assert_frame_equal(rollup_queries.frame_buckets(cur, "c", 10.0), before)
    assert set(rollup_build.differences(cur, "c").values()) == {0}


def test_a_bad_row_is_lost_with_its_rollups_and_the_rest_stay_consistent(store):
    rows = _random_frames("bad", 200, seed=2)
    rows[37]["session_id"] = "not a number"
    store.writer.add_many("frames", rows)
    assert store.writer.flush() == 1
    cur = store.cursor()
    assert rollup_build.counts(cur, "bad")["rolled_frames"] == 199
    assert set(rollup_build.differences(cur, "bad").values()) == {0}


_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from store import Store, rollups
    rollups.COMPACT_EVERY_S = 0.05  # compactions all the time, so the kill can land in one
    store = Store(sys.argv[1])
    rng = np.random.default_rng(0)
    t, k, said = 0.0, 0, False
    while True:
        n = int(rng.integers(50, 3000))
        ts = t + rng.uniform(-1.5, 0.5, n)  # some frames late, into settled buckets
        store.writer.add_many("frames", [
            {"run_id": "kill", "session_id": int(i % 16), "frame_idx": k + i,
             "t_submit": float(max(0.0, ts[i])), "latency_ms": float(rng.lognormal(3.4, 0.5)),
             "naive_latency_ms": 40.0, "tokens_out": 3, "tokens_expected": 3,
             "on_time": True, "naive_on_time": True, "silent": bool(i % 13 == 0),
             "skipped": False, "complete": True, "censored": bool(i % 29 == 0),
             "silent_cause": "compute" if i % 13 == 0 else None} for i in range(n)])
        stalled = rng.uniform() < 0.3  # a stall now and then, its event before or after
        ticks = [{"run_id": "kill", "tick": k // 100 + j, "t": t + j * 0.08, "occupancy": 0.5,
                  "stalled": stalled and j < 4, "live": 16} for j in range(6)]
        event = {"run_id": "kill", "t": t, "kind": "stall", "detail": '{"since": %r}' % t}
        for table, rows in ([("events", [event])] if stalled else []) + [("ticks", ticks)]:
            store.writer.add_many(table, rows)
        t, k = t + 0.5, k + n
        if k > 5000 and not said:  # once: rows on disk, then the run goes on
            store.writer.flush()
            print("flushed", flush=True)
            said = True
        time.sleep(0.01)
""")


def test_rollups_match_the_frames_on_disk_after_a_sigkill_mid_run(tmp_path):
    db = str(tmp_path / "kill.duckdb")
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, db], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Kill mid-run once rows are on disk: the writer says so (start-up takes 1 s on an idle
    # machine and over 4 s at load 20), then a second more of flushes and compactions.
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    said = proc.stdout.readline().strip() if ready else ""
    if said == "flushed":
        time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=30)
    assert said == "flushed", stderr[-2000:]
    store = Store(db)
    try:
        cur = store.cursor()
        c = rollup_build.counts(cur, "kill")
        assert c["frames"] > 1000, stderr[-2000:]
        assert c["frames"] == c["rolled_frames"]
        assert c["ticks"] == c["rolled_ticks"] > 0
        assert rollup_build.differences(cur, "kill") == dict.fromkeys(ROLLUP_TABLES, 0)
        assert cur.execute("SELECT count(*) FROM stall_ends").fetchone()[0] > 0
    finally:
        store.close()


def _legacy_run(store, run_id: str, n: int) -> None:
    """A run as a file from before rollups holds it: frames and ticks, no rollup rows."""
    frames = pd.DataFrame(_random_frames(run_id, n, seed=11))
    ticks = pd.DataFrame({"run_id": run_id, "tick": range(500), "t": np.arange(500) * 0.08,
                          "occupancy": np.linspace(0.1, 1.0, 500), "live": 8,
                          "stalled": np.arange(500) > 450})

    def write(con):
        con.register("_f", frames)
        con.register("_t", ticks)
        con.execute("INSERT INTO frames BY NAME SELECT * FROM _f")
        con.execute("INSERT INTO ticks BY NAME SELECT * FROM _t")

    store.writer.call(write)


def test_a_run_from_before_rollups_is_rolled_up_once_on_first_open(store, monkeypatch):
    monkeypatch.setattr(rollup_build, "CHUNK_FRAMES", 700)  # several chunks, several updates
    _legacy_run(store, "old", 4000)
    cur = store.cursor()
    assert not rollup_build.rolled_up(cur, "old")
    assert rollup_queries.frame_buckets(cur, "old", 1.0).empty  # nothing to draw before
    seen = []
    assert rollup_build.ensure(store, "old", progress=seen.append) is True
    assert len(seen) >= 6 and seen == sorted(seen) and seen[-1] == 1.0
    assert rollup_build.rolled_up(cur, "old")
    assert set(rollup_build.differences(cur, "old").values()) == {0}
    exact = queries.frame_buckets(cur, "old", 5.0)
    assert list(rollup_queries.frame_buckets(cur, "old", 5.0).frames) == list(exact.frames)
    pd.testing.assert_frame_equal(rollup_queries.tick_buckets(cur, "old", 2.0),
                                  queries.tick_buckets(cur, "old", 2.0), check_dtype=False)
    assert rollup_build.ensure(store, "old", progress=seen.append) is False  # once


def test_an_interrupted_first_rollup_is_redone_not_added_twice(store):
    _legacy_run(store, "half", 2000)
    store.writer.call(lambda con: rollup_build._chunk(con, "half", 0.0, 10.0))  # then a crash
    cur = store.cursor()
    assert not rollup_build.rolled_up(cur, "half")
    assert rollup_build.ensure(store, "half") is True
    assert set(rollup_build.differences(cur, "half").values()) == {0}


def test_archived_runs_read_their_rollups_and_old_archives_are_rolled_up(tmp_path):
    from store import open_store

    s = open_store(str(tmp_path / "a.duckdb"))
    try:
        s.writer.execute("INSERT INTO runs (run_id, status) VALUES ('arch', 'finished')")
        s.writer.add_many("frames", _random_frames("arch", 2000, seed=4))
        s.writer.flush()
        want = rollup_queries.frame_buckets(s.cursor(), "arch", 5.0)
        assert archive.archive_run(s, "arch").status == "archived"
        folder = archive.archive_dir(s.path) / "arch"
        for drop_rollups in (False, True):
            if drop_rollups:  # as archived before rollups existed
                for table in ROLLUP_TABLES:
                    (folder / f"{table}.parquet").unlink()
            con = archive.open_archived(s.path, "arch")
            try:
                pd.testing.assert_frame_equal(rollup_queries.frame_buckets(con, "arch", 5.0),
                                              want)
            finally:
                con.close()
    finally:
        s.close()
