"""Shareable reports of one run or two side by side: HTML (self-contained) or PNG.

`metronome report RUN_ID [RUN_ID] --out FILE.{html,png}` and the Runs page's export use this.
The charts are the console's own builders on shared axes; PNG goes through vl-convert (no
browser), HTML inlines the Vega libraries so the file opens without a network.
"""

from __future__ import annotations

import html
import json
import logging
import os
from pathlib import Path

import altair as alt
import pandas as pd

from services import charts
from services import experiments
from services import server_runs
from services.live_data import ensure_rollups, live_data, target_ms
from store import queries

logger = logging.getLogger(__name__)

FORMATS = ("html", "png")
SUMMARY_KEYS = ("status", "engine", "simulated", "policy", "window", "sinks", "sessions_offered",
                "admitted", "rejected", "evicted", "frames", "silent_rate", "silence",
                "silent_memory_frames", "silent_compute_frames", "censored_frames",
                "late_frames", "on_time_rate", "naive_on_time_rate", "p50_ms", "p95_ms",
                "p95_censored", "p99_ms", "p99_censored", "naive_p95_ms", "max_occupancy",
                "stalled", "stall_at_s", "tsat_pred_s", "final_limit", "changes", "rows_lost",
                "duration_s")
# A run the load client recorded (engine remote) says what it heard from its server instead.
CLIENT_KEYS = ("url", "protocol", "frame_mapping", "silent_frames", "no_delta_frames",
               "empty_frames", "stray_deltas", "deltas_unmapped", "first_delta_p50_ms",
               "first_delta_p95_ms", "last_delta_p50_ms", "last_delta_p95_ms")


def _rows(cur, run_ids: list[str]) -> list[dict]:
    if not 1 <= len(run_ids) <= 2:
        raise ValueError(f"a report covers one run or two, not {len(run_ids)}")
    rows = []
    for run_id in run_ids:
        row = queries.run_row(cur, run_id)
        if row is None:
            raise ValueError(f"run {run_id!r} is not in the database")
        rows.append(row)
    return rows


def summary_table(rows: list[dict]) -> pd.DataFrame:
    """The runs' JSON summaries as one table, a column per run (with the client's figures
    when a run was recorded by the load client)."""
    keys = SUMMARY_KEYS + (CLIENT_KEYS if any(server_runs.is_remote(r) for r in rows) else ())
    columns = {}
    for row in rows:
        summary = json.loads(row["summary"]) if row["summary"] else {"status": row["status"]}
        if server_runs.is_remote(row):
            summary = {"engine": row["engine"],
                       "silent_rate": server_runs.figures(row)["silent_share"], **summary}
        columns[row["run_id"]] = [_cell(summary.get(k)) for k in keys]
    return pd.DataFrame(columns, index=list(keys))


def _cell(value):
    """Lists (the live changes) read as one line in the table."""
    if isinstance(value, list):
        return "; ".join(f"{c['change']} at {c['t']:g} s" for c in value) or "none"
    return value


def report_chart(cur, rows: list[dict]) -> alt.VConcatChart:
    """A column per run: latency, occupancy, silent frames; shared x and latency axes."""
    data = [live_data(cur, row) for row in rows]
    x = (0.0, max(float(row["duration_s"]) for row in rows))
    top = max(charts.latency_top([d.frames], float(row["budget_ms"]))
              for row, d in zip(rows, data))
    columns = []
    for row, d in zip(rows, data):
        remote = server_runs.is_remote(row)
        title = f"{row['run_id']} · " + (server_runs.server_of(row).name if remote else
                                         experiments.policy_label(row)) + (
            " · simulated" if row["simulated"] else "")
        latency = charts.latency_chart(d.frames, float(row["budget_ms"]), target_ms(row),
                                       x_domain=x, y_domain=(0, top), title=title,
                                       marks=d.marks)
        # A remote server's pool is not seen by the client: when silence happened instead.
        if remote:
            cells, note = server_runs.silence_map(d.wall)
            middle = charts.silence_map_chart(cells, x, note)
        else:
            middle = charts.occupancy_chart(d.ticks, x_domain=x, marks=d.marks)
        columns.append(alt.vconcat(latency.properties(width=420, height=200),
                                   middle.properties(width=420, height=140),
                                   charts.silent_chart(d.frames, x, d.marks).properties(
                                       width=420, height=100)))
    return alt.hconcat(*columns).resolve_scale(color="shared", strokeDash="shared")


def render(cur, run_ids: list[str], fmt: str, store=None) -> bytes:
    """The report as bytes in `fmt` (html or png). With `store`, runs recorded before rollups
    existed are rolled up first (once); without, the caller has seen to it."""
    if fmt not in FORMATS:
        raise ValueError(f"report format {fmt!r} is not one of {', '.join(FORMATS)}")
    rows = _rows(cur, run_ids)
    for run_id in run_ids if store is not None else ():
        if ensure_rollups(store, run_id):
            logger.info("run %s was recorded before rollups: rolled up once", run_id)
    chart = report_chart(cur, rows)
    if fmt == "png":
        import vl_convert

        return vl_convert.vegalite_to_png(chart.to_dict(), scale=2)
    title = "Metronome report: " + " vs ".join(run_ids)
    page = chart.to_html(inline=True)
    head = (f"<h1>{html.escape(title)}</h1>"
            + summary_table(rows).to_html(na_rep="—", border=0, classes="summary"))
    return page.replace("<body>", f"<body>\n{head}", 1).encode()


def write(cur, run_ids: list[str], out: str, store=None) -> Path:
    """Write the report to `out`; its suffix (.html or .png) picks the format (`store`: as
    `render`)."""
    path = Path(out)
    if not path.parent.is_dir():
        raise ValueError(f"folder {path.parent} does not exist")
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give a FILE.html or FILE.png")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        # before rendering: an unwritable path is bad input, not a minute of charts lost
        raise ValueError(f"{path if path.exists() else path.parent} is not writable")
    fmt = path.suffix.lower().lstrip(".")
    data = render(cur, run_ids, fmt, store)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    logger.info("report of %s written to %s (%d bytes)", ", ".join(run_ids), path, len(data))
    return path
