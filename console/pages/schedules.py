"""Schedules: recurring canaries, experiments and retention; add, pause, resume, remove, fire
now, the next fire time, the latest results and drift of N* and t_sat since the fire before.

The scheduler lives in the console's process (console.shell.scheduler) and fires on the same run
host as the Load page, so a fire never runs on top of another run; this page only edits the
schedules table through it and reads fires from the store.
"""

import json

import pandas as pd
import streamlit as st

from services import schedule_specs as schedules
from console import views
from console.shell import scheduler, store
from services.run_host import one_line
from services.schedule_specs import ScheduleSpec, spec_or_problem
from runtime import ENGINES
from store import StoreError, queries
from store import schedules as table

FROM_FORM = "the settings below"

st.title("Schedules")
cur = store().cursor()
try:
    service = scheduler(store().path)
except Exception as exc:  # noqa: BLE001 - the console's sidebar logs it; say it here too
    st.error(f"the scheduler is not running: {one_line(exc)}")
    st.stop()

recent = queries.runs(cur, 50).to_dict("records")
labels = {r["run_id"]: views.run_label(r) for r in recent if r["status"] == "finished"}
with st.form("schedule_form"):
    a, b, c = st.columns(3)
    name = a.text_input("Name", key="sch_name", placeholder="nightly canary")
    kind = b.selectbox("Kind", schedules.KINDS, key="sch_kind",
                       help="canary: one fixed load on the live settings. retention: move old "
                            "runs to Parquet.")
    trigger = c.selectbox("Trigger", schedules.TRIGGERS, key="sch_trigger")
    a, b, c = st.columns(3)
    every_s = a.number_input("Every (s, interval)", value=3600.0, step=60.0, key="sch_every")
    cron = b.text_input("Cron (minute hour day month weekday)", key="sch_cron",
                        placeholder="0 3 * * *")
    days = c.number_input("Retention: older than (days)", value=30.0, step=1.0, key="sch_days")
    st.markdown("**The runs a fire makes**")
    source = st.selectbox("Settings from", [FROM_FORM, *labels], key="sch_from",
                          format_func=lambda k: labels.get(k, k),
                          help="A canary on the live settings: pick the run that has them; the "
                               "canary keeps its engine, policy, W, S, pool and admission and "
                               "offers its own fixed load.")
    a, b, c, d = st.columns(4)
    engine = a.selectbox("Engine", ENGINES, format_func=views.engine_label, key="sch_engine")
    policy = b.selectbox("KV policy", ["unbounded", "window"], key="sch_policy")
    window = c.number_input("W (window; experiments' windowed runs)", value=128, step=32,
                            key="sch_window")
    pool = d.number_input("Pool blocks", value=256, step=32, key="sch_pool")
    a, b, c, d = st.columns(4)
    sessions = a.number_input("Canary sessions", value=8, step=1, key="sch_sessions")
    duration = b.number_input("Duration (s)", value=10.0, step=5.0, key="sch_duration")
    repeats = c.number_input("Repeats (collapse)", value=3, step=1, key="sch_repeats")
    sinks = d.number_input("S (sinks)", value=0, step=1, key="sch_sinks")
    a, b, c = st.columns(3)
    busy = a.number_input("Busy wait (s)", value=30.0, step=10.0, key="sch_busy",
                          help="How long a fire waits for a run in progress before it skips.")
    grace = b.number_input("Misfire grace (s)", value=60.0, step=10.0, key="sch_grace")
    threshold = c.number_input("Drift threshold (fraction)", value=0.2, step=0.05,
                               key="sch_drift", help="N* or t_sat moving more than this "
                                                     "since the last fire is reported.")
    add = st.form_submit_button("Add schedule", key="sch_add", type="primary")
if add:
    try:
        if source != FROM_FORM:
            live = json.loads(queries.run_row(cur, source)["settings"])
            settings = schedules.canary_settings(live, int(sessions), float(duration))
            if kind != "canary":  # an experiment offers its own load on those settings
                settings = {k: v for k, v in settings.items()
                            if k not in schedules.CANARY_LOAD or k == "duration_s"}
        else:
            windowed = policy == "window"
            settings = {"engine": engine, "policy": policy, "pool_blocks": int(pool),
                        "window": int(window) if windowed else None,
                        "sinks": int(sinks) if windowed else 0, "duration_s": float(duration)}
            if kind == "canary":
                settings = {**settings, **schedules.CANARY_LOAD, "sessions": int(sessions),
                            "duration_s": float(duration)}
        spec = ScheduleSpec(
            name=name, kind=kind, trigger=trigger,
            every_s=float(every_s) if trigger == "interval" else None,
            cron=(cron.strip() or None) if trigger == "cron" else None,
            params=schedules.params_for(kind, settings, int(window), int(sinks), int(repeats),
                                        float(days)),
            misfire_grace_s=float(grace), busy_wait_s=float(busy),
            drift_threshold=float(threshold))
        schedule_id = service.add(spec)
    except (ValueError, StoreError) as exc:
        st.error(one_line(exc))
    else:
        st.success(f"schedule {schedule_id} added: {spec.name}, {spec.trigger_text()}")

rows = table.schedules(cur)
if not rows:
    st.info("No schedules yet: add one above. Fires run one at a time on this console's engine.")
    st.stop()

next_fire = service.next_fire_times()
latest = table.latest_drift(cur).set_index("schedule_id")
for _, last in latest[latest.drifted].iterrows():
    st.warning(f"drift in {last['name']}: {last.drift_note}")
overview = []
for row in rows:
    spec, problem = spec_or_problem(row)
    if spec is None:
        st.error(f"schedule {row['name']} ({row['schedule_id']}) is invalid and skipped: "
                 f"{problem}")
        continue
    last = latest.loc[row["schedule_id"]] if row["schedule_id"] in latest.index else None
    at = next_fire.get(row["schedule_id"])
    overview.append({
        "schedule_id": row["schedule_id"], "name": spec.name, "kind": spec.kind,
        "when": spec.trigger_text(), "paused": bool(row["paused"]),
        "next fire": "paused" if row["paused"] or at is None else f"{at:%Y-%m-%d %H:%M:%S}",
        "last N*": None if last is None else last.n_star,
        "last t_sat (s)": None if last is None else last.t_sat_s,
        "drift": None if last is None else ("yes" if last.drifted else "no")})
st.dataframe(pd.DataFrame(overview), hide_index=True)

names = {r["schedule_id"]: r["name"] for r in rows}
picked = st.selectbox("Schedule", list(names), format_func=lambda k: f"{names[k]} ({k})",
                      key="sch_pick")
a, b, c, d = st.columns(4)
actions = {"sch_pause": ("Pause", service.pause), "sch_resume": ("Resume", service.resume),
           "sch_fire": ("Fire now", service.fire_now), "sch_remove": ("Remove", service.remove)}
for col, (key, (label, action)) in zip((a, b, c, d), actions.items()):
    if col.button(label, key=key):
        try:
            action(picked)
        except ValueError as exc:
            st.error(one_line(exc))
        else:
            st.rerun()

st.subheader("Last results")
fires = table.fires(cur, picked, 20)
if fires.empty:
    st.caption("no fires yet")
else:
    fires["run_ids"] = [", ".join(json.loads(r)) if isinstance(r, str) else "" for r in
                        fires.run_ids]
    st.dataframe(fires[["due_at", "started_at", "ended_at", "status", "reason", "run_ids",
                        "n_star", "t_sat_s", "n_star_change", "t_sat_change", "drift_note"]],
                 hide_index=True)
