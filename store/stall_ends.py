"""Where each stall ended, kept as the rows are written: `stall_ends(run_id, t_event, t_end)`,
the first tick after a `stall` event that was not stalled (store.queries.stall_spans' rule),
so a chart's stall marks read one row per stall instead of every tick of the run.

The writer's side (`OpenStalls`) adds a row in the transaction of the batch that settles it:
the events batch when the tick that flows again is already on disk, else the ticks batch that
brings it. A stall with no row has not ended (its span runs to the last tick). The stalls it
waits on live in memory: after a restart no run is still writing, and a run recorded before
this table existed is given its rows by `rows_sql` when it is rolled up (store/rollup_build.py).
"""

from __future__ import annotations

from collections import defaultdict

FLOWING = "NOT coalesce(stalled, false)"


def rows_sql() -> str:
    """INSERT the stall_ends rows of run $r from its events and ticks (a whole run at once)."""
    return ("INSERT INTO stall_ends SELECT run_id, t_event, t_end FROM ("
            "SELECT e.run_id, e.t AS t_event, (SELECT min(k.t) FROM ticks k WHERE "
            f"k.run_id = e.run_id AND k.t > e.t AND {FLOWING.replace('stalled', 'k.stalled')})"
            " AS t_end FROM (SELECT DISTINCT run_id, t FROM events WHERE run_id = $r AND "
            "kind = 'stall') e) WHERE t_end IS NOT NULL")


class OpenStalls:
    """Stall events written and not yet ended, per run (the writer thread's only)."""

    def __init__(self) -> None:
        self._open: dict[str, set[float]] = defaultdict(set)

    def on_events(self, con, rows: list[dict]) -> list:
        """Inside the events batch's transaction: rows for its stalls already over on disk.
        Returns what to remember once the transaction commits (`commit`)."""
        opened = []
        for row in rows:
            if row.get("kind") != "stall" or row.get("run_id") is None or row.get("t") is None:
                continue
            run_id, t = row["run_id"], float(row["t"])
            end = con.execute(f"SELECT min(t) FROM ticks WHERE run_id = ? AND t > ? AND "
                              f"{FLOWING}", [run_id, t]).fetchone()[0]
            if end is None:
                opened.append((run_id, t))
            elif not con.execute("SELECT count(*) FROM stall_ends WHERE run_id = ? AND "
                                 "t_event = ?", [run_id, t]).fetchone()[0]:
                con.execute("INSERT INTO stall_ends VALUES (?, ?, ?)", [run_id, t, end])
        return [("open", run_id, t) for run_id, t in opened]

    def on_ticks(self, con, rows: list[dict]) -> list:
        """Inside the ticks batch's transaction: rows for the open stalls its ticks end."""
        closed = []
        for run_id, stalls in self._open.items():
            flowing = sorted(float(r["t"]) for r in rows if r.get("run_id") == run_id
                             and r.get("t") is not None and not r.get("stalled"))
            for t_event in sorted(stalls):
                end = next((t for t in flowing if t > t_event), None)
                if end is not None:
                    con.execute("INSERT INTO stall_ends VALUES (?, ?, ?)", [run_id, t_event, end])
                    closed.append(("closed", run_id, t_event))
        return closed

    def commit(self, changes: list) -> None:
        for what, run_id, t in changes:
            if what == "open":
                self._open[run_id].add(t)
            else:
                self._open[run_id].discard(t)
                if not self._open[run_id]:
                    del self._open[run_id]
