"""Drawing an experiment's runs: side by side on shared axes, the collapse table, the converged
cap. A cliff vs slope pair draws its running run live beside the finished one (the pool
filling, frames going silent, as it happens); the other kinds draw their runs once finished."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from runtime.run_summary import RunSummary
from services import calibration
from services import charts
from services import experiments
from services import replay_settings as replay
from services import report
from services import server_runs
from services import story
from console import views
from store import queries, rollup_queries


def finished_rows(cur, run_ids: list[str]) -> list[dict]:
    rows = [queries.run_row(cur, run_id) for run_id in run_ids]
    return [row for row in rows if row is not None and row["summary"]]


def started_rows(cur, run_ids: list[str]) -> list[dict]:
    """The runs that have a row (finished, or running now: its row comes with its start)."""
    rows = [queries.run_row(cur, run_id) for run_id in run_ids]
    return [row for row in rows if row is not None]


def draw_results(cur, kind: str, run_ids: list[str]) -> None:
    if kind == "cliff vs slope":
        rows = started_rows(cur, run_ids)
        done = [r for r in rows if r["summary"]]
        if len(done) == 2:
            st.success(story.story(cur, *(_summary(r) for r in done)))
        if rows:
            side_by_side(cur, rows, planned=len(run_ids))
        if len(done) == 2:
            downloads([r["run_id"] for r in done])
        return
    rows = finished_rows(cur, run_ids)
    if not rows:
        return
    if kind == "collapse":
        table = experiments.collapse_table(rows)
        st.subheader("Collapse table")
        st.dataframe(table.drop(columns=["stalled", "runs"]), hide_index=True)
        st.altair_chart(charts.collapse_chart(table), width="stretch")
    else:
        n_star(cur, rows[0])


def side_by_side(cur, rows: list[dict], planned: int | None = None) -> None:
    """One column per run, every chart on the same axes, so cliff and slope read directly; a
    run still running is drawn as it is written (the fragment redraws it every second), and
    a planned run not started yet holds its column. With a run the load client recorded among
    them, the servers' comparison instead."""
    from console.shell import ensure_rolled_up

    ensure_rolled_up(*(row["run_id"] for row in rows if row["summary"]))
    if any(server_runs.is_remote(row) for row in rows):
        servers_side_by_side(cur, rows)
        return
    data = {row["run_id"]: views.live_data(cur, row) for row in rows}
    x = (0.0, max(float(row["duration_s"]) for row in rows))
    top = max(charts.latency_top([d.frames], float(row["budget_ms"]))
              for row, d in zip(rows, data.values()))
    columns = st.columns(max(len(rows), planned or 0))
    for col, row in zip(columns, rows):
        d = data[row["run_id"]]
        if row["summary"]:
            summary = _summary(row)
            stall = views.stall_text(summary)
            stall = {"never": "never stalled",
                     "partial stall": "partial stall (some sessions starved for blocks)"}.get(
                stall, f"stalled at {stall}")
            col.markdown(f"**{experiments.policy_label(row)}** · seed {row['seed']} · {stall}"
                         + f" · silent {views.silent_text(summary)}"
                         + f" · p95 {views.p95_text(summary)}")
            col.markdown(f"_{story.row_sentence(cur, row)}_")
            col.caption(naive_and_truth(summary))
        else:
            tick = d.tick
            where = "no tick yet" if tick is None else (
                f"{float(tick['t']):.0f} s of {float(row['duration_s']):g} s, pool ρ "
                + ("unknown" if tick.get("occupancy") is None
                   else f"{float(tick['occupancy']):.2f}"))
            col.markdown(f"**{experiments.policy_label(row)}** · seed {row['seed']} · "
                         f"**running now**: {where}")
        col.altair_chart(charts.latency_chart(d.frames, float(row["budget_ms"]), x_domain=x,
                                              y_domain=(0, top), marks=d.marks),
                         width="stretch")
        col.altair_chart(charts.occupancy_chart(d.ticks, x_domain=x, marks=d.marks),
                         width="stretch")
        col.altair_chart(charts.silent_chart(d.frames, x, d.marks), width="stretch")
    for col in columns[len(rows):]:
        col.caption("the next run of the pair starts when this one ends")


def servers_side_by_side(cur, rows: list[dict]) -> None:
    """Runs of different servers (one at least recorded by the load client, which sees no
    pool) on the axes a listener's experience has in common: the per-frame latency, the
    silent share, and when silence happens, session by session."""
    data = {row["run_id"]: views.live_data(cur, row) for row in rows}
    x = (0.0, max(server_runs.time_span(row["duration_s"], d.frames, d.bucket_s)
                  for row, d in zip(rows, data.values())))
    top = max(charts.latency_top([d.frames], float(row["budget_ms"]))
              for row, d in zip(rows, data.values()))
    for col, row in zip(st.columns(len(rows)), rows):
        d = data[row["run_id"]]
        col.markdown(f"**{server_runs.server_of(row).name}** · run {row['run_id']}")
        col.caption(server_runs.server_text(row))
        col.markdown(server_runs.headline(row))
        col.altair_chart(charts.latency_chart(d.frames, float(row["budget_ms"]), x_domain=x,
                                              y_domain=(0, top), marks=d.marks),
                         width="stretch")
        col.altair_chart(charts.silent_share_chart(
            server_runs.silent_share_buckets(d.frames, d.bucket_s), x), width="stretch")
        cells, note = server_runs.silence_map(d.wall)
        col.altair_chart(charts.silence_map_chart(cells, x, note), width="stretch")


def servers_section(cur) -> None:
    """Two finished runs of different servers picked from the store (the latest two the load
    client recorded first), drawn by `side_by_side`: `metronome load` against vLLM's own
    /v1/realtime and against Metronome's gateway, say (benchmarks/vllm_realtime.py)."""
    st.subheader("Servers side by side")
    history = queries.run_history(cur, ["finished"], limit=200)
    if len(history) < 2:
        st.caption("Two finished runs are needed: record a server with `metronome load --url "
                   "ws://…/v1/realtime` (docs/GATEWAY.md) and run it again against another.")
        return
    remote = history.engine == server_runs.REMOTE
    ids = [*history.run_id[remote], *history.run_id[~remote]]
    rows = {r["run_id"]: r for r in history.to_dict("records")}
    rows = {i: {**rows[i], "server": server_runs.server_of(rows[i]).name} for i in ids}
    label = lambda i: views.run_label(rows[i])  # noqa: E731
    a, b = st.columns(2)
    first = a.selectbox("First", ids, format_func=label, key="exp_servers_a")
    second = b.selectbox("Second", ids, index=1, format_func=label, key="exp_servers_b")
    if st.toggle("Show the servers side by side", key="exp_servers_show"):
        side_by_side(cur, finished_rows(cur, list(dict.fromkeys([first, second]))))


def _summary(row: dict) -> RunSummary:
    return RunSummary.from_json(json.loads(row["summary"]))


def naive_and_truth(summary: RunSummary) -> str:
    """What a gateway's dashboard showed beside what users heard."""
    naive, truth = summary.naive_on_time_rate, summary.on_time_rate
    if naive is None or truth is None:
        return "no frames"
    gateway = f"gateway answering after {summary.wait_budget:g} × budget" \
        if summary.wait_budget else "gateway"
    return (f"{gateway} dashboard: {naive:.1%} on time · truth: {truth:.1%} on time, "
            f"{views.silent_text(summary)} silent")


def downloads(run_ids: list[str]) -> None:
    """The pair as one shareable report (HTML opens offline; PNG for a slide), built only when
    clicked."""
    from console.shell import store

    def render(fmt: str):
        return lambda: report.render(store().cursor(), run_ids, fmt, store=store())

    a, b = st.columns(2)
    name = f"metronome-{'-vs-'.join(run_ids)}"
    a.download_button("Download the report (HTML)", render("html"), f"{name}.html",
                      "text/html", key="exp_report_html")
    b.download_button("Download the report (PNG)", render("png"), f"{name}.png",
                      "image/png", key="exp_report_png")


def n_star(cur, row: dict) -> None:
    summary = _summary(row)
    from console.shell import ensure_rolled_up

    ensure_rolled_up(row["run_id"])
    ticks = rollup_queries.tick_buckets(cur, row["run_id"],
                                        views.bucket_for(float(row["duration_s"])))
    converged = experiments.converged_cap(ticks)
    cal = calibration.stored(cur, row["engine"], row["model"])
    rep = experiments.n_star_report(summary, None if cal is None else cal.n_c,
                                    experiments.silent_at_cap(cur, summary))
    a, b, c, d = st.columns(4)
    a.metric("N* (held at the target)", "—" if rep["n_star"] is None else rep["n_star"],
             help=views.N_STAR_HELP)
    a.caption("never settled at the target" if rep["n_star"] is None else
              f"from {rep['n_star_at_s']:.0f} s for {rep['n_star_for_s']:.0f} s")
    b.metric("converged cap (median cap over the last third)", converged)
    c.metric("silent frames at the cap", "—" if rep["silent_at_cap"] is None
             else f"{rep['silent_at_cap']:.1%}")
    c.caption(f"p95 {rep['p95'] or '—'}")
    if cal is None:
        d.caption(f"{row['engine']}/{row['model']} is not calibrated on this machine: no "
                  "compute limit N_c to compare with (Calibrate above)")
    else:
        d.metric(f"N* / N_c (compute limit {cal.n_c}, {cal.label()})",
                 "—" if rep["ratio"] is None else f"{rep['ratio']:.2f}")
    if summary.rejected == 0:
        st.warning("No session was ever rejected: demand never reached the cap, so this is the "
                   "offered load, not N*. Raise the arrival rate or the session length.")
    mark = converged if rep["n_star"] is None else rep["n_star"]
    st.altair_chart(charts.limit_chart(ticks, mark, (0.0, float(row["duration_s"]))),
                    width="stretch")
    s = summary
    st.dataframe(pd.DataFrame([{
        "n_star": s.n_star, "n_star_at_s": s.n_star_at_s, "admitted": s.admitted,
        "rejected": s.rejected, "p95_ms": s.p95_ms, "p95_censored": s.p95_censored,
        "silent_rate": s.silent_rate, "on_time_rate": s.on_time_rate, "stalled": s.stalled}]),
        hide_index=True)


def replay_beside_original(cur, original_id: str, replay_id: str) -> None:
    """A replay and the run it re-offered, one line each ("same load, W = 256: no stall,
    p95 41 ms") over their charts on shared axes."""
    original = queries.run_row(cur, original_id)
    again = queries.run_row(cur, replay_id)
    if again is None or not again["summary"]:
        st.caption("the replay has not finished yet")
        return
    if original is None or not original["summary"]:
        st.caption(f"the original run {original_id} is no longer in the database (archived "
                   f"runs open below)")
        st.markdown(f"**{replay.headline(again)}**")
        return
    left, right = st.columns(2)
    left.markdown(f"**{replay.headline(original)}** · run {original_id}")
    right.markdown(f"**{replay.headline(again, original)}** · run {replay_id}")
    side_by_side(cur, [original, again])
