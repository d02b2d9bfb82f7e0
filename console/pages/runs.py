"""Runs: the recorded history with filters; open a run in the Live view, compare two runs, a
replay beside its original, export a run's frames (Parquet, CSV) and a report (HTML, PNG), and
open a run that retention moved to Parquet."""

import io
import json

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import streamlit as st

from services import report
from services import server_runs
from console import views
from console.shell import LIVE_PAGE, store
from console.experiment_views import finished_rows, replay_beside_original, side_by_side
from runtime import ENGINES
from store import RUN_STATUSES, archive, queries


def archived_section() -> None:
    """Runs retention moved to Parquet, read back through DuckDB's read_parquet."""
    archived = archive.archived_runs(store().path)
    if not archived:
        return
    st.subheader("Archived runs")
    st.caption(f"moved to {archive.archive_dir(store().path)} by retention; read from Parquet")
    chosen = st.selectbox("Archived run", archived, key="runs_archived")
    if st.button("Open archived run", key="runs_archived_open"):
        st.session_state["runs_archived_shown"] = chosen
    shown = st.session_state.get("runs_archived_shown")
    if shown not in archived:
        return
    con = archive.open_archived(store().path, shown)
    try:
        row = queries.run_row(con, shown)
        views.header(row, live=False)
        views.summary_metrics(row["summary"])
        data = views.live_data(con, row)
        views.run_charts(data)
    finally:
        con.close()


def export_frames(run_id: str, fmt: str) -> bytes:
    frames = queries.run_frames(store().cursor(), run_id)
    out = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(frames, out)
    else:
        pacsv.write_csv(frames, out)
    return out.getvalue()


st.title("Runs")
cur = store().cursor()
a, b, c, d = st.columns(4)
status = a.multiselect("Status", RUN_STATUSES, key="runs_status")
engine = b.multiselect("Engine", [*ENGINES, server_runs.REMOTE], key="runs_engine",
                       help="remote: a run the load client (metronome load) recorded against "
                            "a realtime server")
policy = c.multiselect("Policy", ["unbounded", "window"], key="runs_policy")
text = d.text_input("Run id contains", key="runs_text")
history = queries.run_history(cur, status, engine, policy, text)
if history.empty:
    st.info("No recorded runs match." if status or engine or policy or text else
            "No runs yet: start one on the Load page or the Experiments page.")
    archived_section()
    st.stop()

# Who answered: Metronome's engine, or the server a client-recorded run measured (its URL and
# the protocol spoken); the silent share read from either kind of summary.
records = history.to_dict("records")
history.insert(int(history.columns.get_loc("engine")) + 1, "server",
               [server_runs.server_text(r) for r in records])
shares = [server_runs.figures(r)["silent_share"] for r in records]
summaries = [json.loads(s) if s else {} for s in history.pop("summary")]
for key in ("frames", "silent_rate", "p95_ms", "stalled", "stall_at_s"):
    history[key] = [s.get(key) for s in summaries]
history["silent_rate"] = shares
st.dataframe(history, hide_index=True)
records = history.to_dict("records")
labels = {r["run_id"]: views.run_label(r) for r in records}
ids = list(labels)

st.subheader("Open in the Live view")
opened = st.selectbox("Run", ids, format_func=labels.get, key="runs_open")
if st.button("Open in Live", key="runs_open_button"):
    st.session_state["view_run"] = opened
    st.switch_page(LIVE_PAGE)

st.subheader("Compare two runs")
a, b = st.columns(2)
first = a.selectbox("First", ids, format_func=labels.get, key="runs_compare_a")
second = b.selectbox("Second", ids, index=min(1, len(ids) - 1), format_func=labels.get,
                     key="runs_compare_b")
if st.toggle("Show comparison", key="runs_compare_show"):
    rows = finished_rows(cur, list(dict.fromkeys([first, second])))
    if rows:
        st.dataframe(report.summary_table(rows))
        side_by_side(cur, rows)
    else:
        st.caption("only finished runs can be compared")

replays = queries.replays(cur)
if not replays.empty:
    st.subheader("Replays beside their originals")
    originals = dict(zip(replays.run_id, replays.original))
    replay = st.selectbox("Replay", list(originals), key="runs_replay",
                          format_func=lambda r: f"{labels.get(r, r)} ← {originals[r]}")
    replay_beside_original(cur, originals[replay], replay)

st.subheader("Export")
chosen = st.selectbox("Run", ids, format_func=labels.get, key="runs_export")
a, b, c, d = st.columns(4)
# Built only when clicked (a callable), in the click's own thread with its own cursor: a large
# run's export must not slow every rerun of this page.
a.download_button("Frames (Parquet)", lambda: export_frames(chosen, "parquet"),
                  f"{chosen}-frames.parquet", key="dl_parquet")
b.download_button("Frames (CSV)", lambda: export_frames(chosen, "csv"), f"{chosen}-frames.csv",
                  key="dl_csv")
c.download_button("Report (HTML)",
                  lambda: report.render(store().cursor(), [chosen], "html", store=store()),
                  f"{chosen}-report.html", key="dl_html")
d.download_button("Report (PNG)",
                  lambda: report.render(store().cursor(), [chosen], "png", store=store()),
                  f"{chosen}-report.png", key="dl_png")
st.caption("`metronome report RUN_ID [RUN_ID] --out FILE.html|png` writes the same reports "
           "(two runs side by side) from the command line.")

archived_section()
