"""What the Live view shows for one run, shared by the Live, Runs and Experiments pages.

`services.live_data.live_data` holds every query a Live refresh makes; the draw functions here only
turn its frames into charts and metrics (Streamlit), so a refresh never touches the run itself.
"""

from __future__ import annotations

import json
import logging
import math

import pandas as pd
import streamlit as st

from runtime.run_summary import RunSummary
from services import charts
from services import server_runs
# The data half lives in services/live_data.py (no Streamlit); named here for the pages.
from services.live_data import (LiveData, bucket_for, engine_label,  # noqa: F401
                                live_data, policy_text, run_label, target_ms)

logger = logging.getLogger(__name__)

FIT_LOOKBACK_S = 10.0  # how far back the fitted ρ(t) line is drawn (the fit's own span)


# --- drawing ----------------------------------------------------------------------------------
def header(row: dict, live: bool, history: pd.DataFrame | None = None,
           store_health: dict | None = None) -> None:
    """Who the run is, the settings in force now (with the live changes that led there, "W 128
    → 32 at 4.5 s"), and anything the store lost while recording it."""
    simulated = " · simulated (twin)" if row["simulated"] else ""
    st.subheader(f"Run {row['run_id']}{simulated}")
    if not live:
        reason = f" — {row['reason']}" if row["reason"] else ""
        st.caption(f"{row['status']}{reason}")
    now = dict(row)
    changes = history[history.setting != "start"] if history is not None else pd.DataFrame()
    if history is not None and not history.empty:
        last = history.iloc[-1]
        now.update(policy=last.policy, window_tokens=_int(last.window_tokens),
                   sink_tokens=_int(last.sink_tokens), admission=last.admission)
    dtype = row.get("dtype")
    dtype = f" · {dtype}" if isinstance(dtype, str) and dtype else ""  # NULL: simulated/older
    st.caption(f"{row['model']}{dtype} · {policy_text(now)} · N={row['sessions']} · load "
               f"{row['load']} "
               f"· admission {now['admission']} · pool {row['pool_blocks']} blocks · frame "
               f"{row['frame_ms']:g} ms · budget {row['budget_ms']:g} ms")
    if not changes.empty:
        st.caption("Live changes: " + "; ".join(
            f"{c} at {t:.1f} s" for t, c in zip(changes.t, changes.change)))
    lost = store_lost(row, store_health)
    if lost:
        st.error(lost)
    if now["policy"] == "window":
        st.caption("Kept KV is whole blocks (sinks + window from its first kept block), so it "
                   "is not token-exact [0,S) ∪ (t−W, t].")


def store_lost(row: dict, store_health: dict | None) -> str | None:
    """One line when rows of this run were lost on the way to the store (from the run's
    summary once it ended, from the writer while it runs), else None."""
    if row.get("summary"):
        summary = json.loads(row["summary"])
        if not server_runs.is_remote(row):  # a load client's summary is of another shape
            summary = RunSummary.from_json(summary)
            lost, errors = summary.rows_lost or 0, summary.store_errors or {}
        else:
            lost, errors = summary.get("rows_lost") or 0, summary.get("store_errors") or {}
    elif store_health is not None:
        lost, errors = sum(store_health["rows_lost"].values()), store_health["errors"]
    else:
        return None
    if not lost:
        return None
    detail = "; ".join(f"{table}: {error}" for table, error in errors.items())
    return f"Store lost {lost} row(s) of this run — {detail}"


def _int(x) -> int | None:
    return None if x is None or pd.isna(x) else int(x)


def gauges(data: LiveData) -> None:
    """Sessions, cap, admission counters, ρ and the t_sat countdown from the newest tick."""
    tick = data.tick
    cols = st.columns(8)
    if tick is None:
        cols[0].metric("live sessions", "—")
        return
    cols[0].metric("live sessions", int(tick["live"]))
    cols[1].metric("cap (limit)", int(tick["limit_sessions"]), help=binds_text(tick))
    n_star = _int(tick.get("n_star"))
    cols[2].metric("N*", "—" if n_star is None else n_star, help=N_STAR_HELP)
    cols[3].metric("admitted", int(tick["admitted"]))
    cols[4].metric("rejected", int(tick["rejected"]))
    cols[5].metric("evicted", int(tick["evicted"]))
    cols[6].metric("pool ρ", f"{tick['occupancy']:.2f}")
    cols[7].metric("t_sat (ρ → 1)", tsat_text(tick))


N_STAR_HELP = ("the live sessions the admission controller held at the latency target over "
               "its last stable stretch (≥ 5 control intervals, live within ±1, the cap "
               "binding, p95 ≤ 1.05 × target); — until there is one, and for a fixed cap")


def binds_text(tick: dict) -> str:
    """Which one holds the live count now: the cap (admission) or the offered load."""
    live, cap = int(tick["live"]), int(tick["limit_sessions"])
    if live >= cap - 1:
        return f"the cap binds: {live} live at a cap of {cap} (arrivals wait or are turned away)"
    return f"the offered load binds: {cap - live} more sessions would be admitted now"


def tsat_text(tick: dict) -> str:
    """The countdown: seconds until the pool saturates at the current fill rate."""
    if tick["occupancy"] >= 0.999:
        return "saturated"
    tsat = tick.get("tsat_s")
    if tsat is None or pd.isna(tsat):
        return "not rising"
    return f"in {tsat:.1f} s"


def truth_and_lie(data: LiveData) -> None:
    """The naive gateway metrics next to the truthful ones, each labelled."""
    df = data.frames
    frames = int(df["frames"].sum()) if not df.empty else 0
    naive_col, truth_col = st.columns(2)
    with naive_col:
        st.markdown("**Naive gateway metrics** — latency capped at the wait budget, an empty "
                    "frame counts as on time")
        naive_on_time = _weighted(df, "naive_miss_rate")
        a, b = st.columns(2)
        a.metric("on time (naive)", _pct(None if naive_on_time is None else 1 - naive_on_time))
        b.metric("p95 now (naive)", _ms(_last(df, "naive_p95_ms")))
    with truth_col:
        st.markdown("**Truthful metrics** — true latency, a frame with no tokens is silent")
        miss = _weighted(df, "miss_rate")
        silent = df["silent_per_s"].sum() * data.bucket_s if frames else None
        a, b, c = st.columns(3)
        a.metric("on time (truth)", _pct(None if miss is None else 1 - miss))
        b.metric("p95 now (truth)", _ms_or_censored(_last(df, "p95_ms"),
                                                    float(data.row["budget_ms"])))
        c.metric("silent frames", _pct(None if silent is None else silent / frames))
    naive, truth = charts.truth_and_lie(df, float(data.row["budget_ms"]), data.x_domain)
    naive_col.altair_chart(naive, width="stretch")
    truth_col.altair_chart(truth, width="stretch")


WALL_TITLE = "Session wall (dark: silent)"


def by_origin(data: LiveData) -> pd.DataFrame:
    """Sessions, frames and the silent share per origin (the run's load, `gateway` clients),
    from the session wall's rollups."""
    wall, origins = data.wall, data.origins or {}
    if wall.empty:
        return pd.DataFrame(columns=["origin", "sessions", "frames", "silent"])
    df = wall.assign(origin=wall.session_id.map(origins).fillna("?"),
                     silent=wall.silent_share * wall.frames)
    out = df.groupby("origin").agg(sessions=("session_id", "nunique"), frames=("frames", "sum"),
                                   silent=("silent", "sum")).reset_index()
    out["silent"] = (out.silent / out.frames.clip(lower=1)).map(_pct)
    return out


def run_charts(data: LiveData, origin: str | None = None) -> None:
    """`origin`: the session wall shows only that origin's sessions (the other charts are the
    whole run's: the rollups behind them are per run, not per origin)."""
    row = data.row
    x = data.x_domain
    st.altair_chart(charts.latency_chart(data.frames, float(row["budget_ms"]), target_ms(row),
                                         x_domain=x, marks=data.marks), width="stretch")
    tick = data.tick
    projection = None if tick is None else charts.rho_projection(
        float(tick["t"]), float(tick["occupancy"]), tick.get("rho_slope_per_s"),
        tick.get("tsat_s"), FIT_LOOKBACK_S)
    left, right = st.columns(2)
    left.altair_chart(charts.occupancy_chart(data.ticks, projection, x, marks=data.marks),
                      width="stretch")
    right.altair_chart(charts.silent_chart(data.frames, x, data.marks), width="stretch")
    if data.ranks is not None and not data.ranks.empty:
        text = stalled_rank_text(data.ranks)
        if text:
            st.error(text)
        st.altair_chart(charts.rank_occupancy_chart(data.ranks, x, data.marks), width="stretch")
    left, right = st.columns(2)
    n_star = None if tick is None else _int(tick.get("n_star"))
    left.altair_chart(charts.sessions_chart(data.ticks, x, data.marks, n_star), width="stretch")
    wall = data.wall
    if origin is not None and not wall.empty:
        wall = wall[wall.session_id.map(data.origins or {}) == origin]
    image, caption = charts.session_wall_image(wall, x[1], data.bucket_s)
    right.markdown(f"**{WALL_TITLE}**" + (f" · origin `{origin}`" if origin else ""))
    right.image(image, caption=caption, width="stretch")


def stalled_rank_text(ranks: pd.DataFrame) -> str | None:
    """Names the ranks that stalled and when, beside what the engine-wide mean read then:
    with data parallelism an average hides a full rank. None when no rank stalled."""
    stalled = ranks[ranks.stalled.astype(bool)]
    if stalled.empty:
        return None
    first = stalled.groupby("rank").t.min().sort_values()
    t0 = float(first.iloc[0])
    mean = float(ranks[ranks.t == t0].occupancy.mean())
    names = ", ".join(f"rank {int(r)} from {float(t):.0f} s" for r, t in first.items())
    return (f"Stalled: {names} (pool full, no token out; its sessions are silent). "
            f"The mean over {ranks['rank'].nunique()} ranks read {mean:.2f} then.")


def summary_metrics(summary_json: str | None) -> None:
    if not summary_json:
        return
    stored = json.loads(summary_json)
    if "silent_rate" not in stored:  # the load client's run: what it saw of another server
        client_metrics(stored)
        return
    summary = RunSummary.from_json(stored)
    cols = st.columns(6)
    cols[0].metric("frames", summary.frames)
    cols[1].metric("silent", _pct(summary.silent_rate))
    cols[2].metric("on time", _pct(summary.on_time_rate))
    cols[3].metric("p95 (truth)", p95_text(summary),
                   help="'> budget': the p95's rank falls among frames that got no answer, "
                        "whose latency is unknown (censored), so it is not a number")
    cols[4].metric("max ρ", f"{summary.max_occupancy:.2f}")
    cols[5].metric("stalled at", stall_text(summary), help=SILENCE_HELP)
    causes = summary.silent_by_cause
    if summary.silent_frames and None not in causes.values():
        st.caption("Silent frames by cause: " + ", ".join(
            f"{cause} {n}" for cause, n in causes.items() if n) + f" (of {summary.frames})")


def client_metrics(summary: dict) -> None:
    """A run the load client recorded: no pool, no tick; frames as the client saw them."""
    frames = summary.get("frames") or 0
    cols = st.columns(5)
    cols[0].metric("frames", frames)
    cols[1].metric("silent", _pct(summary.get("silent_frames", 0) / frames if frames else None))
    cols[2].metric("on time", _pct(summary.get("on_time_rate")))
    cols[3].metric("last delta p50", _ms(summary.get("last_delta_p50_ms")))
    cols[4].metric("last delta p95", _ms(summary.get("last_delta_p95_ms")))
    st.caption(f"recorded by the load client against {summary.get('url')} (protocol "
               f"{summary.get('protocol')}, frames mapped by {summary.get('frame_mapping')}): "
               "the server's pool and ticks are not seen from here")


SILENCE_HELP = ("stall: the pool was full and no session got a token (every conversation "
                "silent); partial stall: the pool was full and some sessions starved for blocks "
                "while others ran; compute: steps ran past the deadline with room in the pool")


def stall_text(summary: RunSummary) -> str:
    stall = summary.stall_at_s
    if stall is not None:
        if summary.ranked and summary.stalled_rank is not None:
            return f"{stall:.1f} s (rank {summary.stalled_rank})"
        return f"{stall:.1f} s"
    if summary.partial_stall:
        return "partial stall"
    return "never"


def silent_text(summary: RunSummary) -> str:
    """The run's silent share, or "unknown" for a run with no frame to count."""
    rate = summary.silent_rate
    return "unknown (no frames)" if rate is None else f"{rate:.1%}"


def p95_text(summary: RunSummary) -> str:
    """The run's p95: a number, or "> budget" when its rank falls among unanswered frames."""
    if summary.p95_censored:
        return f"> {summary.budget_ms:g} ms"
    return _ms(summary.p95_ms)


def _weighted(df: pd.DataFrame, column: str) -> float | None:
    if df.empty or df["frames"].sum() == 0:
        return None
    return float((df[column] * df["frames"]).sum() / df["frames"].sum())


def _last(df: pd.DataFrame, column: str) -> float | None:
    return None if df.empty else float(df[column].iloc[-1])


def _ms_or_censored(x: float | None, budget_ms: float) -> str:
    if x is not None and not pd.isna(x) and math.isinf(x):
        return f"> {budget_ms:g} ms"
    return _ms(x)


def _pct(x: float | None) -> str:
    return "—" if x is None or pd.isna(x) else f"{x:.1%}"


def _ms(x: float | None) -> str:
    return "—" if x is None or pd.isna(x) else f"{x:.0f} ms"
