"""The console's Schedules page, archived runs and replays on the Runs page, and a replay
started from the Load page (AppTest, twin only)."""

from __future__ import annotations

import datetime as dt
import json
import time

from console.shell import run_host, scheduler
from store import archive, open_store, queries
from store import schedules as table
from tests.console.conftest import charts_by_title, finished_twin_run, page, wait_settled


def test_schedules_page_renders_with_no_schedules(db):
    at = page("schedules")
    assert not at.exception and not at.error
    assert "No schedules yet" in at.info[0].value
    assert scheduler(db).running  # the console started it


def test_add_pause_resume_and_remove_a_schedule_from_the_page(db):
    at = page("schedules")
    at.text_input(key="sch_name").input("hourly canary")
    at.selectbox(key="sch_kind").select("canary")
    at.selectbox(key="sch_engine").select("twin")
    at.number_input(key="sch_pool").set_value(64)
    at.number_input(key="sch_every").set_value(3600.0)
    at.button(key="sch_add").click().run()
    assert not at.exception and not at.error, at.error
    assert "added: hourly canary, every 1 h" in at.success[0].value
    (row,) = table.schedules(open_store(db).cursor())
    assert row["params"]["settings"]["load"] == "fixed"
    overview = at.dataframe[0].value
    assert overview.name.tolist() == ["hourly canary"]
    next_fire = dt.datetime.strptime(overview["next fire"].iloc[0], "%Y-%m-%d %H:%M:%S")
    assert 3500 < (next_fire - dt.datetime.now()).total_seconds() <= 3600

    at.button(key="sch_pause").click().run()
    assert at.dataframe[0].value["next fire"].tolist() == ["paused"]
    assert table.schedules(open_store(db).cursor())[0]["paused"]
    at.button(key="sch_resume").click().run()
    assert at.dataframe[0].value["next fire"].iloc[0] != "paused"
    at.button(key="sch_fire").click().run()  # fire now: a run on the console's own host
    deadline = time.monotonic() + 20
    while not (table.fires(open_store(db).cursor()).status == "finished").any():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    at.run()
    fires = at.dataframe[1].value
    assert fires.status.tolist() == ["finished"] and fires.run_ids.iloc[0]
    at.button(key="sch_remove").click().run()
    assert "No schedules yet" in at.info[0].value
    assert run_host().state().series.kind == "schedule hourly canary"


def test_an_invalid_schedule_is_explained_inline(db):
    at = page("schedules")
    at.text_input(key="sch_name").input("bad")
    at.selectbox(key="sch_trigger").select("cron")
    at.text_input(key="sch_cron").input("61 * * * *")
    at.button(key="sch_add").click().run()
    assert not at.exception
    assert len(at.error) == 1 and "cron '61 * * * *'" in at.error[0].value
    assert table.schedules(open_store(db).cursor()) == []


def test_drift_is_said_on_the_page(db):
    store = open_store(db)
    at = page("schedules")
    at.text_input(key="sch_name").input("canary")
    at.selectbox(key="sch_engine").select("twin")
    at.button(key="sch_add").click().run()
    (row,) = table.schedules(store.cursor())
    table.insert_fire(store, {
        "fire_id": "f1", "schedule_id": row["schedule_id"], "due_at": dt.datetime.now(),
        "ended_at": dt.datetime.now(), "status": "finished", "t_sat_s": 2.0,
        "t_sat_change": -0.5, "drifted": True,
        "drift_note": "t_sat moved 4 s → 2 s (-50%, threshold ±20%)"})
    at.run()
    assert any("drift in canary: t_sat moved 4 s → 2 s" in w.value for w in at.warning)
    assert at.dataframe[0].value["drift"].tolist() == ["yes"]


def test_runs_page_opens_an_archived_run(db):
    old = finished_twin_run(db)
    young = finished_twin_run(db, seed=1)
    store = open_store(db)
    long_ago = dt.datetime.now() - dt.timedelta(days=60)
    store.writer.call(lambda con: con.execute(
        "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = ?", [long_ago, long_ago, old]))
    (result,) = archive.archive_older_than(store, 30 * 86400)
    assert result.status == "archived"

    at = page("runs")
    assert not at.exception and not at.error
    assert at.dataframe[0].value.run_id.tolist() == [young]
    assert at.selectbox(key="runs_archived").options == [old]
    at.button(key="runs_archived_open").click().run()
    assert not at.exception and not at.error
    assert any(old in s.value for s in at.subheader)
    shown = charts_by_title(at)
    assert shown["Frame latency vs budget"][0] > 0
    assert {m.label for m in at.metric} >= {"frames", "silent", "max ρ"}


def test_runs_page_shows_a_replay_beside_its_original(db):
    original = finished_twin_run(db, pool_blocks=32, duration_s=6.0)
    at = page("load")
    at.selectbox(key="engine").select("twin")
    at.selectbox(key="load").select("replay")
    at.text_input(key="replay_run").input(original)
    at.selectbox(key="policy").select("window")
    at.number_input(key="window").set_value(64)
    at.number_input(key="pool_blocks").set_value(32)
    at.number_input(key="duration_s").set_value(99.0)  # a replay's duration is the recording's
    at.button(key="start").click().run()
    assert not at.exception and not at.error, at.error
    assert wait_settled().status == "finished"
    open_store(db).writer.flush()
    replay_id = run_host().state().run_id
    row = queries.run_row(open_store(db).cursor(), replay_id)
    settings = json.loads(row["settings"])
    assert (row["load"], settings["replay_run"], row["duration_s"]) == ("replay", original, 6.0)

    at = page("runs")
    assert at.selectbox(key="runs_replay").value == replay_id
    lines = [m.value for m in at.markdown]
    assert any(v.startswith("**original, unbounded: stalled at ") for v in lines), lines
    assert any(v.startswith("**same load, W = 64: no stall, p95 ") for v in lines), lines
