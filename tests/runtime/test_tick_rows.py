"""The typed tick rows name exactly the columns store/schema.py gives their tables."""

from dataclasses import fields

import pytest

from runtime.tick_rows import RankTickRow, TickRow


@pytest.mark.parametrize("row, table", [(TickRow, "ticks"), (RankTickRow, "rank_ticks")])
def test_a_tick_row_has_a_field_per_column(store, row, table):
    columns = [c for (c,) in store.cursor().execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ?",
        [table]).fetchall()]
    assert sorted(f.name for f in fields(row)) == sorted(columns)


def test_a_twin_run_writes_its_ticks_through_them(store):
    from engine.twin import CostModel, TwinEngine
    from runtime import RunConfig, Runner

    cfg = RunConfig(engine="twin", duration_s=1.0, sessions=4, data_parallel_size=2,
                    policy="window", window=64)
    s = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store).run()
    store.writer.flush()
    cur = store.cursor()
    for table in ("ticks", "rank_ticks"):
        # Every column written: a column the row left out would read NULL everywhere.
        n, stalled_known = cur.execute(
            f"SELECT count(*), count(stalled) FROM {table} WHERE run_id = ?",
            [s.run_id]).fetchone()
        assert n > 0 and stalled_known == n
