"""The data of the Live view for one run, without Streamlit: every query a Live refresh makes
(`live_data`; the benchmark times exactly this) and the one-line labels the pages and the
report share. console/views.py draws it; the report (`metronome report`) renders it to a file.

A refresh reads the rollups (store/rollup_queries.py): O(buckets) rows per chart however many
frames the run has, never a scan of `frames` or `ticks`, and never touches the run itself. A
run recorded before rollups existed is rolled up once first (`ensure_rollups`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from services import charts
from store import queries, rank_queries, rollup_marks, rollup_queries

MAX_BUCKETS = 300  # points per chart: beyond this a browser redraw at 1 Hz gets slow


# Chart buckets a rollup level divides (store/rollups.LEVELS: 1, 10, 60, 300, 600, 3600 s), so a
# chart reads at most 5 rollup rows per point; past an hour, whole hours.
NICE_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)


def bucket_for(span_s: float) -> float:
    """Time bucket for a run of `span_s` seconds: 1 s, coarser for long runs so every chart
    keeps at most MAX_BUCKETS points per series; always a size some rollup level divides."""
    need = span_s / MAX_BUCKETS if math.isfinite(span_s) else 1.0
    for size in NICE_BUCKETS_S:
        if size >= need:
            return float(size)
    return float(3600 * math.ceil(need / 3600))


@dataclass
class LiveData:
    row: dict
    tick: dict | None
    frames: pd.DataFrame  # queries.frame_buckets
    ticks: pd.DataFrame  # queries.tick_buckets
    wall: pd.DataFrame  # queries.session_wall
    bucket_s: float
    marks: charts.Marks  # stalls, live changes, the t_sat prediction
    history: pd.DataFrame  # queries.settings_history
    ranks: pd.DataFrame | None = None  # rank_queries.rank_buckets; empty with one rank
    origins: dict | None = None  # session id → origin (queries.session_origins)

    @property
    def x_domain(self) -> tuple[float, float]:
        return 0.0, float(self.row["duration_s"])


@dataclass
class _Settled:
    """What can no longer change, kept between refreshes of one viewer: frame, tick and rank
    buckets before `until`."""
    until: float  # buckets starting before this edge are final
    frames: pd.DataFrame
    wall: pd.DataFrame
    ticks: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)


def live_data(cur, row: dict, cache: dict | None = None) -> LiveData:
    """Everything one Live refresh shows, from the rollups. With `cache` (one per viewer, e.g.
    session state), buckets that have settled are kept and only newer rollup rows are read
    again, so a refresh of a long run costs the last seconds, not the whole run; a run that
    has ended is settled entirely and reads no bucket rows at all."""
    bucket = bucket_for(float(row["duration_s"]))
    run_id = row["run_id"]
    summary = rollup_marks.tick_summary(cur, run_id)
    tick = rollup_marks.latest_tick(cur, run_id, summary)
    settled = (cache or {}).get((run_id, bucket)) or _Settled(0.0, pd.DataFrame(), pd.DataFrame())
    since = settled.until
    empty = pd.DataFrame()
    if math.isinf(since):  # an ended run, all settled
        new = {"frames": empty, "wall": empty, "ticks": empty, "ranks": empty}
    else:
        new = {"frames": rollup_queries.frame_buckets(cur, run_id, bucket, since),
               "wall": rollup_queries.session_wall(cur, run_id, bucket, since),
               "ticks": rollup_queries.tick_buckets(cur, run_id, bucket, since),
               # a run whose settled part has ticks and no rank rows has one rank: no query
               "ranks": empty if since > 0 and settled.ranks.empty and not settled.ticks.empty
               else rank_queries.rank_buckets(cur, run_id, bucket, since)}
    frames, wall, ticks, ranks = (_append(getattr(settled, k), new[k]) for k in new)
    history = queries.settings_history(cur, run_id)
    marks = charts.Marks(rollup_marks.stall_spans(cur, run_id, summary),
                         history[history.setting != "start"][["t", "change"]],
                         rollup_marks.tsat_prediction(cur, run_id, tick=tick,
                                                        summary=summary))
    if cache is not None and not math.isinf(since):
        until = _settled_edge(row, tick, bucket)  # never before `since`: ticks only advance
        cache[(run_id, bucket)] = _Settled(until, *(
            _append(getattr(settled, k), new[k][new[k].t < until] if not new[k].empty
                    else new[k]) for k in new))
    return LiveData(row, tick, frames, ticks, wall, bucket, marks, history, ranks,
                    queries.session_origins(cur, run_id))


def _settled_edge(row: dict, tick: dict | None, bucket: float) -> float:
    """The bucket edge before which no frame row can still arrive: a frame is written about a
    frame period after its submission (at its session's next frame) plus a writer flush."""
    if row["status"] != "running":
        return math.inf
    if tick is None:
        return 0.0
    lag_s = 1.0 + 2 * float(row["frame_ms"]) / 1e3
    return max(0.0, math.floor((float(tick["t"]) - lag_s) / bucket) * bucket)


def _append(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    if old.empty:
        return new
    if new.empty:
        return old
    return pd.concat([old, new], ignore_index=True)


def engine_label(engine: str | None) -> str:
    return "twin (simulated)" if engine == "twin" else "vLLM"


def policy_text(row: dict) -> str:
    if row["policy"] == "window":
        return f"window W={row['window_tokens']} S={row['sink_tokens']}"
    return str(row["policy"])


def run_label(row: dict) -> str:
    """One line naming a run in pickers: id, status, engine, policy (a client-recorded run:
    its server, when the row names it), N."""
    engine = "twin (simulated)" if row["simulated"] else row["engine"]
    what = (row.get("server") or "server") if row["engine"] == "remote" else policy_text(row)
    return f"{row['run_id']} · {row['status']} · {engine} · {what} · N={row['sessions']}"


def target_ms(row: dict) -> float | None:
    if row.get("admission") in ("aimd", "gradient") and row.get("target") is not None:
        return float(row["target"]) * float(row["budget_ms"])
    return None


def ensure_rollups(store, run_id: str, progress=None) -> bool:
    """Roll up a run recorded before rollups existed, once, before its first view (the Live
    and Runs pages pass a progress bar's update, the CLI a log line); True when it had to."""
    from store import rollup_build

    return rollup_build.ensure(store, run_id, progress)
