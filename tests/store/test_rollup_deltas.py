"""The writer's rollup deltas computed in Python (store/rollup_deltas.py) are the rows
`rollups.delta_sql` makes from the same batch: NULLs, NaN, +inf, bin edges, every level."""

from __future__ import annotations

import math
import random

import pytest

from store import Store, rollup_deltas, rollups
from store.batches import batch_of, columns_of
from store.maintainer import Maintainer

CAUSES = ("memory", "compute", "guard", "other", None, "unknown")


def _maybe(rng, value, p_none=0.1):
    return None if rng.random() < p_none else value


def _frames(rng: random.Random, n: int) -> list[dict]:
    edges = [rollups.BIN_BASE_MS * rollups.BIN_RATIO ** k for k in (0, 1, 57, 150, 399, 400)]
    rows = []
    for _ in range(n):
        latency = rng.choice([rng.uniform(0, 300), rng.choice(edges), math.inf, math.nan,
                              None, 0.0, 1e9])
        rows.append({
            "run_id": rng.choice(["a", "b"]), "session_id": _maybe(rng, rng.randrange(5)),
            "frame_idx": rng.randrange(1000),
            "t_submit": _maybe(rng, rng.choice([rng.uniform(0, 4000), 59.999, 60.0, 0.0])),
            "latency_ms": latency, "naive_latency_ms": _maybe(rng, rng.uniform(0, 120)),
            "tokens_out": _maybe(rng, rng.randrange(5)), "on_time": _maybe(rng, rng.random() < .7),
            "naive_on_time": _maybe(rng, rng.random() < .8),
            "silent": _maybe(rng, rng.random() < .3), "silent_cause": rng.choice(CAUSES),
            "censored": _maybe(rng, rng.random() < .2, 0.4),
            "complete": _maybe(rng, rng.random() < .8)})
    return rows


def _ticks(rng: random.Random, n: int) -> list[dict]:
    return [{"run_id": rng.choice(["a", "b"]), "t": _maybe(rng, round(k * 0.08, 2)),
             "live": _maybe(rng, rng.randrange(10), 0.3),
             "limit_sessions": _maybe(rng, rng.randrange(10)), "used_blocks": rng.randrange(99),
             "total_blocks": 100, "admitted": rng.randrange(9), "rejected": rng.randrange(3),
             "evicted": _maybe(rng, 0), "tsat_s": rng.choice([math.inf, None, rng.uniform(1, 9)]),
             "rho_slope_per_s": _maybe(rng, rng.uniform(-1, 1)),
             "n_star": _maybe(rng, rng.randrange(9), 0.5),
             "occupancy": rng.choice([None, 0.5, 0.99, rng.random()]),
             "stalled": _maybe(rng, rng.random() < 0.2), "overrun_ms": _maybe(rng, rng.random())}
            for k in rng.sample(range(20000), n)]


@pytest.fixture
def writer(tmp_path):
    store = Store(str(tmp_path / "deltas.duckdb"))
    yield store.writer
    store.close()


def _both(con, table: str, rows: list[dict]) -> dict[str, tuple[list, list]]:
    """Per rollup table of `table`: (delta_sql's rows, rollup_deltas' rows), sorted."""
    batch = batch_of(rows)
    con.register("_batch", batch)
    src = rollups.source(table, "_batch", set(columns_of(batch)))
    out, python = {}, rollup_deltas.deltas_of(table, rows)
    for rollup in rollups.ROLLED[table]:
        for side in ("sql", "py"):
            con.execute(f"CREATE OR REPLACE TEMP TABLE {side}_{rollup} AS "
                        f"SELECT * FROM {rollup} LIMIT 0")
        con.execute(rollups.delta_sql(rollup, src, into=f"sql_{rollup}"))
        con.register("_delta", batch_of(python[rollup]))
        con.execute(f"INSERT INTO py_{rollup} BY NAME SELECT * FROM _delta")
        con.unregister("_delta")
        out[rollup] = tuple(con.execute(f"SELECT * FROM {side}_{rollup} ORDER BY ALL")
                            .fetchall() for side in ("sql", "py"))
    con.unregister("_batch")
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_python_deltas_are_delta_sqls_rows(writer, seed):
    rng = random.Random(seed)
    frames, ticks = _frames(rng, 400), _ticks(rng, 300)
    got = writer.call(lambda con: {**_both(con, "frames", frames), **_both(con, "ticks", ticks)})
    assert set(got) == set(rollups.SPECS)
    for rollup, (sql, py) in got.items():
        assert sql, rollup  # the rows reach every table (the comparison is not of nothing)
        assert py == sql, rollup


def test_an_odd_value_falls_back_to_sql_and_counts_once(writer):
    """A value Python will not read as DuckDB's CAST does (a latency given as text) leaves
    the batch to delta_sql: its rollups are written once, not twice and not wrongly."""
    rows = _frames(random.Random(7), 50)
    for row in rows:
        row["t_submit"] = 1.5
    rows[3]["latency_ms"] = "12.5"
    with pytest.raises(TypeError):
        rollup_deltas.deltas_of("frames", rows)

    def insert(con):
        Maintainer().insert(con, "frames", rows)
        return con.execute("SELECT sum(frames) FROM frame_rollups WHERE level_s = 1").fetchone()

    assert writer.call(insert) == (len(rows),)
