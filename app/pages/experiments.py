"""Experiments: cliff vs slope, the collapse table over repeated seeds, N* discovery.

An experiment is a series of runs on the run host (one engine at a time); this page plans it,
shows its progress, and draws the finished runs from the store on shared axes.
"""

import os

import streamlit as st

from app import experiments, views
from app.console import run_host, store
from app.engine_host import ACTIVE, one_line
from app.experiment_views import draw_results
from runtime import ENGINES, RunConfig, latest_cost_model
from runtime.forecast import forecast_pair
from store import StoreError

REFRESH_S = 1.0
FORECAST_SEEDS = int(os.environ.get("METRONOME_FORECAST_SEEDS", "200"))  # tests use fewer
d = experiments.DEFAULTS

st.title("Experiments")
host = run_host()
with st.form("experiment_form"):
    kind = st.radio("Experiment", experiments.KINDS, key="exp_kind", horizontal=True,
                    help="cliff vs slope: one seeded load, unbounded then windowed. collapse: "
                         "that pair over n seeds. N* discovery: a ramp with AIMD admission.")
    a, b, c, e = st.columns(4)
    engine = a.selectbox("Engine", ENGINES, index=ENGINES.index(d["engine"]),
                         format_func=views.engine_label, key="exp_engine")
    sessions = b.number_input("Sessions offered", value=d["sessions"], step=1, key="exp_sessions")
    rate = c.number_input("Arrival rate (sessions/s)", value=d["arrival_rate"], step=0.5,
                          key="exp_rate")
    session_s = e.number_input("Session length (s)", value=d["session_s"], step=1.0,
                               key="exp_session_s")
    a, b, c, e = st.columns(4)
    duration = a.number_input("Duration (s)", value=d["duration_s"], step=5.0, key="exp_duration")
    pool = b.number_input("Pool blocks", value=d["pool_blocks"], step=32, key="exp_pool")
    window = c.number_input("W (windowed runs)", value=128, step=32, key="exp_window")
    sinks = e.number_input("S (windowed runs)", value=0, step=1, key="exp_sinks")
    a, b = st.columns(2)
    seed = a.number_input("Seed", value=0, step=1, key="exp_seed")
    repeats = b.number_input("Repeats (collapse)", value=10, step=1, key="exp_repeats")
    go = st.form_submit_button("Run experiment", key="exp_run", type="primary")
    predict = st.form_submit_button(
        f"Predict collapse first (twin, {FORECAST_SEEDS} seeds per policy)", key="exp_predict",
        help="Runs these settings on the simulated twin over many seeds, unbounded and with "
             "the window above, and says how often the pool stalls: no engine time used.")
if go or predict:
    try:
        base = RunConfig(engine=engine, load=d["load"], sessions=int(sessions),
                         arrival_rate=float(rate), session_s=float(session_s),
                         duration_s=float(duration), pool_blocks=int(pool), seed=int(seed))
        if go:
            configs = experiments.plan(kind, base, int(window), int(sinks), int(repeats))
            host.start_series(configs, store().path, kind=kind)
        else:
            bar = st.progress(0.0, text="predicting on the twin")
            pair = forecast_pair(base, int(window), int(sinks), FORECAST_SEEDS,
                                 latest_cost_model(store()),
                                 lambda f: bar.progress(f, text=f"predicting: {f:.0%}"))
            bar.empty()
            st.session_state["exp_forecast"] = [f.as_dict() for f in pair]
    except (ValueError, StoreError) as exc:
        st.error(one_line(exc))
for forecast in st.session_state.get("exp_forecast", []):
    (st.warning if forecast["collapsed"] else st.success)(
        "Predicted (twin): " + forecast["sentence"])


@st.fragment(run_every=REFRESH_S)
def results() -> None:
    state = host.state()
    series = state["series"]
    if series is None or series["kind"] not in experiments.KINDS:  # e.g. a schedule's fire
        st.info("No experiment yet in this console: set one up above and run it.")
        return
    if state["status"] in ACTIVE:
        st.progress(series["progress"], text=f"{series['kind']}: run {series['index'] + 1} of "
                                             f"{series['total']} · {state['status']}")
    draw_results(store().cursor(), series["kind"], series["run_ids"])


results()
