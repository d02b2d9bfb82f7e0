"""The console page: set a run up, start and stop it, watch it live, look back at past runs.

The page only reads: the run lives in the process-wide RunHost (app.engine_host) and its data
in the DuckDB store, so a rerun of this script (every interaction, every fragment tick) never
touches the run itself.
"""

from __future__ import annotations

import json
import logging

import streamlit as st

from app import charts
from app.engine_host import ACTIVE, RunHost, one_line
from engine.contract import POLICIES
from engine.models import NAMED_MODELS
from runtime import ENGINES, RunConfig
from store import StoreError, db_path, open_store, queries

logger = logging.getLogger(__name__)

REFRESH_S = 1.0
BUCKET_S = 1.0  # latency and silent-frame aggregation
PAST_RUNS = 50
LIVE = "live"  # the run picker's entry that follows the host's current run


@st.cache_resource(show_spinner=False, on_release=RunHost.close)
def run_host() -> RunHost:
    """One host per process: DuckDB allows one writer per file and vLLM one engine per chip."""
    return RunHost()


def main() -> None:
    path = db_path()
    try:
        store = open_store(path)
    except StoreError as exc:
        st.error(one_line(exc))
        return
    host = run_host()
    st.title("Metronome")
    st.caption(f"database {store.path}")
    with st.sidebar:
        _controls(host, path)
    selected = _run_picker(store)
    _live(host, store, selected)


# --- set-up and start/stop --------------------------------------------------------------------
def _engine_label(engine: str) -> str:
    return "twin (simulated)" if engine == "twin" else "vLLM"


def _controls(host: RunHost, path: str) -> None:
    st.header("New run")
    with st.form("run_form", border=False):
        config_args = _settings_widgets()
        start = st.form_submit_button("Start", key="start", type="primary")
    if st.button("Stop", key="stop"):
        host.stop()
    if start:
        try:
            # RunConfig validates everything; its ValueError is already one operator-facing line.
            host.start(RunConfig(**config_args), path)
        except (ValueError, StoreError) as exc:
            st.error(one_line(exc))
        else:
            st.session_state["view_run"] = LIVE  # the picker is drawn after this, so this is legal


def _settings_widgets() -> dict:
    """The form's widgets, as RunConfig keyword arguments. No bounds on the inputs: RunConfig's
    checks are the single source of truth, and their messages name the allowed range."""
    engine = st.selectbox("Engine", ENGINES, format_func=_engine_label, key="engine")
    model = st.selectbox("Model", NAMED_MODELS, key="model")
    policy = st.selectbox("KV policy", POLICIES, key="policy")
    window = st.number_input(
        "W: window tokens", value=256, step=32, key="window",
        help="Used with policy window. Kept KV is whole blocks (sinks + window from its first "
             "kept block), so it is not token-exact [0,S) ∪ (t−W, t].")
    sinks = st.number_input("S: sink tokens", value=0, step=1, key="sinks",
                            help="Used with policy window: the session's first tokens, kept.")
    sessions = st.number_input("Sessions N", value=8, step=1, key="sessions")
    frame_ms = st.number_input("Frame period (ms)", value=80.0, step=10.0, key="frame_ms")
    pool_blocks = st.number_input("Pool blocks", value=256, step=32, key="pool_blocks")
    duration_s = st.number_input("Duration (s)", value=10.0, step=5.0, key="duration_s")
    wait_budget = st.number_input(
        "Wait budget (fraction of the frame budget)", value=None, step=0.1, key="wait_budget",
        placeholder="off",
        help="Gateway mode: answer an empty frame after this fraction of the budget.")
    windowed = policy == "window"
    return {"engine": engine, "model": model, "policy": policy,
            "window": int(window) if windowed else None, "sinks": int(sinks) if windowed else 0,
            "sessions": int(sessions), "frame_ms": float(frame_ms),
            "pool_blocks": int(pool_blocks), "duration_s": float(duration_s),
            "wait_budget": wait_budget}


def _run_picker(store) -> str:
    past = queries.runs(store.cursor(), PAST_RUNS)
    labels = {r.run_id: _run_label(r) for r in past.itertuples()}
    return st.selectbox("Run", [LIVE, *labels], key="view_run",
                        format_func=lambda run_id: labels.get(run_id, "current run (live)"))


def _run_label(run) -> str:
    engine = "twin (simulated)" if run.simulated else run.engine
    policy = f"window W={run.window_tokens} S={run.sink_tokens}" if run.policy == "window" \
        else run.policy
    return f"{run.run_id} · {run.status} · {engine} · {policy} · N={run.sessions}"


# --- the live section -------------------------------------------------------------------------
@st.fragment(run_every=REFRESH_S)
def _live(host: RunHost, store, selected: str) -> None:
    state = host.state()
    _rerun_page_when_run_ends(state)
    cur = store.cursor()
    run_id = state["run_id"] if selected == LIVE else selected
    if run_id is None:
        latest = queries.runs(cur, 1)
        if latest.empty:
            st.info("No runs yet: set one up in the sidebar and press Start.")
            return
        run_id = latest.run_id.iloc[0]
    if run_id == state["run_id"]:
        _host_status(state)
    row = queries.run_row(cur, run_id)
    if row is None:
        return  # the engine is still starting; the run's row comes with its first tick
    _run_header(row, live=run_id == state["run_id"])
    _run_charts(cur, row)


def _rerun_page_when_run_ends(state: dict) -> None:
    """A fragment redraws only itself; when the run ends, redraw the page so the run picker
    lists it."""
    active = state["status"] in ACTIVE
    was_active = st.session_state.get("_run_active", False)
    st.session_state["_run_active"] = active
    if was_active and not active:
        st.rerun(scope="app")


def _host_status(state: dict) -> None:
    engine = _engine_label(state["engine"])
    st.progress(state["progress"], text=f"{state['status']} · run {state['run_id']} · {engine}")
    if state["status"] == "starting" and not state["simulated"]:
        st.caption("vLLM takes about 20 s to start.")
    if state["error"]:
        st.error(state["error"])


def _run_header(row: dict, live: bool) -> None:
    simulated = " · simulated (twin)" if row["simulated"] else ""
    st.subheader(f"Run {row['run_id']}{simulated}")
    if not live:
        reason = f" — {row['reason']}" if row["reason"] else ""
        st.caption(f"{row['status']}{reason}")
    policy = f"window W={row['window_tokens']} S={row['sink_tokens']}" \
        if row["policy"] == "window" else row["policy"]
    st.caption(f"{row['model']} · {policy} · N={row['sessions']} · pool {row['pool_blocks']} "
               f"blocks · frame {row['frame_ms']:g} ms · budget {row['budget_ms']:g} ms")
    if row["summary"]:
        _summary_metrics(json.loads(row["summary"]))


def _summary_metrics(summary: dict) -> None:
    def pct(x):
        return "—" if x is None else f"{x:.1%}"

    cols = st.columns(5)
    cols[0].metric("frames", summary["frames"])
    cols[1].metric("silent", pct(summary["silent_rate"]))
    cols[2].metric("on time", pct(summary["on_time_rate"]))
    cols[3].metric("max ρ", f"{summary['max_occupancy']:.2f}")
    stall = summary["stall_at_s"]
    cols[4].metric("stalled at", "never" if stall is None else f"{stall:.1f} s")


def _run_charts(cur, row: dict) -> None:
    run_id = row["run_id"]
    budget = row["budget_ms"]
    target = row["target"] * budget if row["admission"] == "aimd" else None
    latency = queries.latency_percentiles(cur, run_id, BUCKET_S)
    st.altair_chart(charts.latency_chart(latency, budget, target), width="stretch")
    left, right = st.columns(2)
    left.altair_chart(charts.occupancy_chart(queries.occupancy(cur, run_id)), width="stretch")
    right.altair_chart(charts.silent_chart(queries.silent_per_s(cur, run_id, BUCKET_S)),
                       width="stretch")
