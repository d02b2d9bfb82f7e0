"""Live: the current run (or any past run) as it is written: latency against the budget, the
pool and its fitted ρ(t), silent frames, sessions and cap, the session wall, and the naive
gateway metrics beside the truthful ones."""

import streamlit as st

from services import demo
from console import views
from console.shell import LIVE, PAGES, ensure_rolled_up, run_host, store
from services.run_host import ACTIVE, one_line
from console.live_cache import LiveCache
from store import StoreError, queries

REFRESH_S = 1.0
PAST_RUNS = 200

st.title("Live")
runs = queries.runs(store().cursor(), PAST_RUNS).to_dict("records")
labels = {r["run_id"]: views.run_label(r) for r in runs}
if st.session_state.get("view_run") not in (LIVE, *labels):
    st.session_state["view_run"] = LIVE  # a run picked on the Runs page that is not listed yet
if not runs and run_host().state().status not in ACTIVE:
    # An empty console: one click calibrates (when this machine has no calibration yet), runs
    # the pair and lands on the comparison.
    engine = demo.demo_engine()
    if st.button(f"Run the cliff vs slope demo (calibrated for this machine, {engine})",
                 key="demo_start", type="primary"):
        try:
            run_host().start_prepared(demo.preparation(engine, watched=True), 2,
                                      store().path, kind="cliff vs slope")
        except (ValueError, StoreError) as exc:
            st.error(one_line(exc))
        else:
            st.session_state["exp_engine"] = engine  # the form shows the demo's engine
            st.switch_page(str(PAGES / "experiments.py"))
selected = st.selectbox("Run", [LIVE, *labels], key="view_run",
                        format_func=lambda run_id: labels.get(run_id, "current run (live)"))


@st.fragment(run_every=REFRESH_S)
def live(selected: str) -> None:
    state = run_host().state()
    cur = store().cursor()
    run_id = state.run_id if selected == LIVE else selected
    if run_id is None:
        latest = queries.runs(cur, 1)
        if latest.empty:
            st.info("No runs yet: start one on the Load page, or run the demo above.")
            return
        run_id = latest.run_id.iloc[0]
    is_current = run_id == state.run_id
    if is_current and state.status == "starting":
        st.info(f"run {run_id} is starting"
                + ("" if state.simulated else " (vLLM takes about 20 s)"))
    row = queries.run_row(cur, run_id)
    if row is None:
        return  # the run's row comes with its first tick
    ensure_rolled_up(run_id)
    data = views.live_data(cur, row, st.session_state.setdefault("_live_cache", LiveCache()))
    views.header(row, live=is_current and row["status"] == "running", history=data.history,
                 store_health=store().writer.health() if is_current else None)
    views.summary_metrics(row["summary"])
    views.gauges(data)
    origin = None
    kinds = sorted(set((data.origins or {}).values()))
    if len(kinds) > 1 or "gateway" in kinds:  # remote clients: who is who
        left, right = st.columns([1, 2])
        origin = left.selectbox("Sessions from", [None, *kinds], key="live_origin",
                                format_func=lambda o: "every origin" if o is None else o)
        right.table(views.by_origin(data).set_index("origin"))
    views.run_charts(data, origin)
    views.truth_and_lie(data)


live(selected)
