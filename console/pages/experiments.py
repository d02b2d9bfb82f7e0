"""Experiments: cliff vs slope, the collapse table over repeated seeds, N* discovery.

An experiment is a series of runs on the run host (one engine at a time); this page plans it,
shows its progress, and draws the finished runs from the store on shared axes. With a
calibration of the selected engine on this machine, the settings start from the demo derived
from it (services/demo.py); settings typed by hand that cannot show a cliff are named before the run.
"""

import os

import streamlit as st

from services import calibration
from services import demo
from services import experiments
from console import views
from console.shell import run_host, store
from services.run_host import ACTIVE, one_line
from console.experiment_views import draw_results, servers_section
from runtime import ENGINES, RunConfig, latest_cost_model
from runtime.forecast import forecast_pair
from store import StoreError, queries

REFRESH_S = 1.0
FORECAST_SEEDS = int(os.environ.get("METRONOME_FORECAST_SEEDS", "200"))  # tests use fewer
# The models an experiment runs: the text stand-in, and on vLLM the audio-in model (its frames
# through its processor and encoder). The console's one-click demo stays on tiny: on a 2-core
# CPU audio-tiny's N_c is lower (docs/benchmarks/audio_model.md).
MODELS = {"tiny": "tiny (text; audio as stand-in ids)",
          "audio-tiny": "audio-tiny (audio through its encoder)"}
d = experiments.DEFAULTS


def calibrated_values(cal) -> dict:
    s = demo.derive(cal)
    return {"exp_load": "fixed", "exp_sessions": s.sessions, "exp_duration": s.duration_s,
            "exp_frame_ms": s.frame_ms,
            "exp_pool": s.pool_blocks, "exp_window": s.window, "exp_sinks": s.sinks,
            "exp_wait": s.wait_budget}


def use_calibrated(cal) -> None:
    st.session_state.update(calibrated_values(cal))


st.title("Experiments")
host = run_host()
busy = host.state().status in ACTIVE
kind = st.radio("Experiment", experiments.KINDS, key="exp_kind", horizontal=True,
                help="cliff vs slope: one seeded load, unbounded then windowed. collapse: "
                     "that pair over n seeds. N* discovery: Poisson arrivals with AIMD "
                     "admission; reports N* (the live count held at the target), N*/N_c, "
                     "silent frames at the cap and p95.")
if "exp_engine" not in st.session_state:
    # The demo's engine when the demo sent us here, else the latest run's (vLLM and its
    # calibration after a vLLM demo), the default engine on an empty database.
    latest = queries.runs(store().cursor(), limit=1).engine.tolist()
    st.session_state["exp_engine"] = latest[0] if latest and latest[0] in ENGINES \
        else d["engine"]
engine = st.selectbox("Engine", ENGINES, format_func=views.engine_label, key="exp_engine")
# The twin simulates token costs only: the audio path needs the real engine.
model = st.selectbox("Model", list(MODELS) if engine == "vllm" else ["tiny"],
                     format_func=MODELS.get, key="exp_model")
cal = calibration.stored(store().cursor(), engine, model)
a, b, c = st.columns([3, 1, 1])
if cal is None:
    a.caption(f"{engine}/{model} is not calibrated on this machine: the settings below are "
              f"generic and may show no cliff here.")
else:
    try:
        period = demo.choose_period(cal.periods).sentence + "."
    except ValueError as exc:
        period = one_line(exc)
    a.caption(f"{cal.label()} ({cal.dtype}): compute limit N_c = {cal.n_c} sessions at "
              f"{cal.frame_ms:g} ms frames (p95 ≤ {cal.target_ms:.0f} ms with W = "
              f"{cal.window_tokens}), took {cal.seconds:.0f} s. {period[0].upper()}{period[1:]}")
    b.button("Use calibrated settings", key="exp_use_calibrated", on_click=use_calibrated,
             args=(cal,), disabled=cal.n_c < 1)
if c.button("Recalibrate" if cal else "Calibrate", key="exp_calibrate", disabled=busy):
    try:
        host.start_prepared(demo.recalibration(engine, model), 0, store().path,
                            kind="calibration")
    except (ValueError, StoreError) as exc:
        st.error(one_line(exc))

initial = {"exp_load": d["load"], "exp_sessions": d["sessions"], "exp_duration": d["duration_s"],
           "exp_frame_ms": 80.0,
           "exp_pool": d["pool_blocks"], "exp_window": 128, "exp_sinks": 0, "exp_wait": 0.0}
for key, value in initial.items():
    st.session_state.setdefault(key, value)
# A calibration the fields have not been filled from yet (new, or another engine's) fills them:
# after the one-click demo the form shows the settings the demo ran with.
stamp = None if cal is None else (engine, str(cal.calibrated_at))
if cal is not None and cal.n_c >= 1 and st.session_state.get("_exp_filled_from") != stamp:
    use_calibrated(cal)
    st.session_state["_exp_filled_from"] = stamp

a, b, c, e = st.columns(4)
load = a.selectbox("Load", ("fixed", "poisson"), key="exp_load",
                   help="fixed: every session from the start (a sharp cliff); poisson: "
                        "arrivals at the rate, each for the session length")
sessions = b.number_input("Sessions offered", step=1, key="exp_sessions")
rate = c.number_input("Arrival rate (sessions/s)", value=d["arrival_rate"], step=0.5,
                      key="exp_rate")
session_s = e.number_input("Session length (s)", value=d["session_s"], step=1.0,
                           key="exp_session_s")
a, b, c, e = st.columns(4)
duration = a.number_input("Duration (s)", step=5.0, key="exp_duration")
pool = b.number_input("Pool blocks", step=32, key="exp_pool")
window = c.number_input("W (windowed runs)", step=32, key="exp_window")
sinks = e.number_input("S (windowed runs)", step=1, key="exp_sinks")
a, b, c, e = st.columns(4)
seed = a.number_input("Seed", value=0, step=1, key="exp_seed")
repeats = b.number_input("Repeats (collapse)", value=10, step=1, key="exp_repeats")
frame_ms = c.number_input("Frame period (ms)", step=80.0, key="exp_frame_ms",
                          help="a calibration picks the shortest period this machine serves a "
                               "convincing load at (80 ms, or as an omni model would tick)")
wait = e.number_input("Gateway wait (× budget, 0: none)", step=0.1, key="exp_wait",
                      help="a gateway answers an empty frame after this share of the budget, "
                           "and its dashboard counts it on time: the naive view's lie")


def base_config() -> RunConfig:
    poisson = load == "poisson" or kind == "N* discovery"
    return RunConfig(engine=engine, model=model, load="poisson" if poisson else "fixed",
                     sessions=int(sessions), arrival_rate=float(rate) if poisson else None,
                     session_s=float(session_s) if poisson else None,
                     duration_s=float(duration), pool_blocks=int(pool), seed=int(seed),
                     frame_ms=float(frame_ms),
                     wait_budget=float(wait) or None)


if kind != "N* discovery":
    try:
        n_c = None if cal is None or cal.frame_ms != float(frame_ms) else cal.n_c
        for problem in demo.cliff_problems(base_config(), int(window), int(sinks), n_c):
            st.warning(f"No cliff to show: {problem}.")
    except ValueError:
        pass  # named when the experiment is run
run_col, predict_col = st.columns([1, 3])
if run_col.button("Run experiment", key="exp_run", type="primary", disabled=busy):
    try:
        configs = experiments.plan(kind, base_config(), int(window), int(sinks), int(repeats))
        host.start_series(configs, store().path, kind=kind)
    except (ValueError, StoreError) as exc:
        st.error(one_line(exc))
if predict_col.button(f"Predict collapse first (twin, {FORECAST_SEEDS} seeds per policy)",
                      key="exp_predict",
                      help="Runs these settings on the simulated twin over many seeds, "
                           "unbounded and with the window above, and says how often the pool "
                           "stalls: no engine time used."):
    try:
        bar = st.progress(0.0, text="predicting on the twin")
        pair = forecast_pair(base_config(), int(window), int(sinks), FORECAST_SEEDS,
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
    series = state.series
    if state.status != "preparing":
        # A calibration stored since the form was drawn (the one-click demo's, which may end
        # before this fragment first sees it preparing) fills the form: draw the page again.
        now = calibration.stored(store().cursor(), engine, model)
        if now is not None and (engine, str(now.calibrated_at)) != stamp:
            st.rerun(scope="app")
    if series is not None and series.kind == "calibration":
        if state.status in ACTIVE and state.note:
            st.progress(state.note[0], text=state.note[1])
        elif state.error:
            st.error(f"calibration failed: {state.error}")
        return
    if series is None or series.kind not in experiments.KINDS:  # e.g. a schedule's fire
        st.info("No experiment yet in this console: set one up above and run it.")
        return
    if state.status == "preparing":
        fraction, text = state.note or (0.0, "calibrating")
        st.progress(fraction, text=f"{series.kind}: {text}")
    elif state.status in ACTIVE:
        st.progress(series.progress, text=f"{series.kind}: run {series.index + 1} of "
                                             f"{series.total} · {state.status}")
    elif state.status == "failed" and state.error:
        st.error(state.error)
    draw_results(store().cursor(), series.kind, series.run_ids)


results()
servers_section(store().cursor())
