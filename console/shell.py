"""The console: one Streamlit app, a page per concern (Live, Controls, Load, Experiments, Runs,
Schedules).

Pages only read: the run lives in the process-wide RunHost (services.run_host) and its data in the
DuckDB store, so a rerun of a page script (every interaction, every fragment tick) never
touches the run itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

import streamlit as st

from services.run_host import ACTIVE, HostState, RunHost, one_line
from services.scheduler import SchedulerService
from services.live_data import ensure_rollups
from console.views import engine_label
from store import Store, StoreError, db_path, open_store

logger = logging.getLogger(__name__)

PAGES = Path(__file__).parent / "pages"
LIVE_PAGE = str(PAGES / "live.py")
LIVE = "live"  # the Live page's run picker entry that follows the host's current run
STATUS_REFRESH_S = 1.0


@st.cache_resource(show_spinner=False, on_release=RunHost.close)
def run_host() -> RunHost:
    """One host per process: DuckDB allows one writer per file and vLLM one engine per chip."""
    return RunHost()


@st.cache_resource(show_spinner=False, on_release=SchedulerService.shutdown)
def scheduler(path: str) -> SchedulerService:
    """One scheduler per process and database, firing on the console's own run host (so a
    fire and an operator's run never overlap); started with the console, stopped with it."""
    return SchedulerService(run_host(), path).start()


def store() -> Store:
    """The process-wide store for $METRONOME_DB; pages call this after main() checked it."""
    return open_store(db_path())


def ensure_rolled_up(*run_ids: str) -> None:
    """Runs recorded before rollups existed are rolled up once, before their first view, with
    a progress bar (a run already rolled up costs nothing: services.live_data.ensure_rollups)."""
    for run_id in run_ids:
        bar = []

        def progress(fraction: float, run_id=run_id, bar=bar) -> None:
            text = f"run {run_id} was recorded before rollups: rolling it up once"
            if not bar:
                bar.append(st.progress(0.0, text=text))
            bar[0].progress(min(1.0, fraction), text=text)

        ensure_rollups(store(), run_id, progress)
        if bar:
            bar[0].empty()


def main() -> None:
    try:
        path = store().path
    except StoreError as exc:
        st.error(one_line(exc))
        return
    page = st.navigation([
        st.Page(LIVE_PAGE, title="Live", default=True, url_path="live"),
        st.Page(str(PAGES / "controls.py"), title="Controls", url_path="controls"),
        st.Page(str(PAGES / "load.py"), title="Load", url_path="load"),
        st.Page(str(PAGES / "experiments.py"), title="Experiments", url_path="experiments"),
        st.Page(str(PAGES / "runs.py"), title="Runs", url_path="runs"),
        st.Page(str(PAGES / "schedules.py"), title="Schedules", url_path="schedules"),
    ])
    try:
        scheduler(path)
    except Exception as exc:  # noqa: BLE001 - the pages still work; say why nothing fires
        logger.exception("scheduler did not start")
        st.sidebar.error(f"schedules are not firing: {one_line(exc)}")
    with st.sidebar:
        st.caption(f"database {path}")
        _running_now(run_host())
        _store_health()
    page.run()


@st.fragment(run_every=STATUS_REFRESH_S)
def _running_now(host: RunHost) -> None:
    """What is running, on every page, so no page hides an active run."""
    state = host.state()
    if state.run_id is None and state.status not in ACTIVE:
        st.caption("nothing running")
        return
    series = state.series
    progress = state.progress if series is None else series.progress
    what = f"run {state.run_id}" if series is None else \
        f"{series.kind} run {series.index + 1}/{series.total}"
    if state.status == "preparing" and state.note:
        progress, what = state.note[0], state.note[1]  # e.g. the calibration's probes
    st.progress(progress, text=f"{state.status} · {what} · {engine_label(state.engine)}")
    if state.error:
        st.error(state.error)
    _rerun_page_when_run_ends(state)


@st.fragment(run_every=STATUS_REFRESH_S)
def _store_health() -> None:
    """Rows the store could not write, where the operator looks: nothing lost says nothing."""
    health = store().writer.health()
    lost = sum(health["rows_lost"].values())
    if lost:
        detail = "; ".join(f"{t}: {e}" for t, e in health["errors"].items())
        st.error(f"Store lost {lost} row(s) — {detail}")
    elif health["backpressure_waits"]:
        st.warning(f"Store fell behind {health['backpressure_waits']} time(s) "
                   f"({health['queued']} items queued)")


def _rerun_page_when_run_ends(state: HostState) -> None:
    """A fragment redraws only itself; when a run ends, redraw the page so pickers list it."""
    active = state.status in ACTIVE
    was_active = st.session_state.get("_run_active", False)
    st.session_state["_run_active"] = active
    if was_active and not active:
        st.rerun(scope="app")
