"""The scheduler on the twin: fires make runs linked to their schedule, schedules survive a
restart, a busy engine delays or skips a fire (reason stored), drift and retention."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from services.run_host import RunHost
from services.scheduler import SchedulerService, add_schedule
from services import schedule_specs as schedules
from services.schedule_specs import ScheduleSpec, drift
from runtime import RunConfig, execute
from store import archive, open_store, queries
from store import schedules as table

CANARY = {"engine": "twin", "policy": "unbounded", "pool_blocks": 64, "sessions": 8,
          "duration_s": 4.0}
TIMEOUT_S = 20.0


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "sched.duckdb")
    services: list[SchedulerService] = []
    hosts: list[RunHost] = []

    def start(host: RunHost | None = None) -> SchedulerService:
        host = host or RunHost()
        hosts.append(host)
        services.append(SchedulerService(host, path, poll_s=0.02).start())
        return services[-1]

    yield path, start
    for service in services:
        service.shutdown()
    for host in hosts:
        host.close()
    open_store(path).close()


def _canary(every_s: float = 1.0, **kw) -> ScheduleSpec:
    return ScheduleSpec("canary", "canary", every_s=every_s, params={"settings": CANARY}, **kw)


def _fires_until(path: str, schedule_id: str, done, timeout: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while True:
        fires = table.fires(open_store(path).cursor(), schedule_id)
        if done(fires):
            return fires
        assert time.monotonic() < deadline, fires[["status", "reason"]].to_string()
        time.sleep(0.05)


def _finished(n: int):
    return lambda f: (f.status == "finished").sum() >= n


def test_fires_make_runs_linked_to_the_schedule_and_it_survives_a_restart(db):
    path, start = db
    service = start()
    schedule_id = service.add(_canary(every_s=1.0))
    fires = _fires_until(path, schedule_id, _finished(2))
    service.shutdown()

    done = fires[fires.status == "finished"]
    run_ids = [json.loads(r) for r in done.run_ids]
    assert all(len(ids) == 1 for ids in run_ids)
    cur = open_store(path).cursor()
    linked = {ids[0] for ids in run_ids}
    assert len(linked) == len(done)  # one run per fire
    for run_id in linked:
        assert queries.run_row(cur, run_id)["status"] == "finished"
    assert done.t_sat_s.notna().all()  # the unbounded canary fills its pool

    restarted_at = dt.datetime.now()
    again = start()
    assert schedule_id in again.next_fire_times()
    fires = _fires_until(path, schedule_id, _finished(len(done) + 1))
    newest = fires[fires.status == "finished"].iloc[0]
    assert newest.started_at >= restarted_at
    assert json.loads(newest.run_ids)[0] not in linked


def test_a_fire_while_a_run_is_active_is_skipped_with_the_reason(db):
    path, start = db
    host = RunHost()
    busy = host.start(RunConfig(engine="twin", paced=True, duration_s=60.0, sessions=2), path)
    service = start(host)
    schedule_id = service.add(_canary(every_s=1.0, busy_wait_s=0.3))
    fires = _fires_until(path, schedule_id, lambda f: (f.status == "skipped").any())
    skipped = fires[fires.status == "skipped"].iloc[0]
    assert f"busy with run {busy}" in skipped.reason and "0.3 s busy wait" in skipped.reason
    assert skipped.run_ids is None or json.loads(skipped.run_ids) == []
    assert host.state().run_id == busy  # the operator's run went on untouched
    host.stop()


def test_a_fire_waits_for_a_short_run_and_a_fire_behind_it_is_skipped(db):
    path, start = db
    host = RunHost()
    busy = host.start(RunConfig(engine="twin", paced=True, duration_s=2.5, sessions=2), path)
    service = start(host)
    schedule_id = service.add(_canary(every_s=1.0, busy_wait_s=30.0))
    fires = _fires_until(path, schedule_id, lambda f: _finished(1)(f)
                         and (f.status == "skipped").any())
    first = fires[fires.status == "finished"].iloc[-1]
    assert first.reason.startswith("delayed ") and f"busy with run {busy}" in first.reason
    assert json.loads(first.detail)["waited_s"] > 0.5
    behind = fires[fires.status == "skipped"].iloc[-1]
    assert "previous fire of this schedule is still running" in behind.reason
    # never on top: the fire's run started after the operator's run had ended
    cur = open_store(path).cursor()
    ours = queries.run_row(cur, json.loads(first.run_ids)[0])
    assert ours["started_at"] >= queries.run_row(cur, busy)["ended_at"]


def test_a_restart_makes_up_a_fire_within_grace_and_records_a_missed_one(db):
    path, start = db
    store = open_store(path)
    recent = add_schedule(store, _canary(every_s=60.0, misfire_grace_s=30.0))
    stale = add_schedule(store, _canary(every_s=60.0, misfire_grace_s=10.0))
    now = dt.datetime.now()
    for schedule_id, ago_s in ((recent, 65), (stale, 600)):
        store.writer.call(lambda con, sid=schedule_id, ago=ago_s: con.execute(
            "UPDATE schedules SET created_at = ? WHERE schedule_id = ?",
            [now - dt.timedelta(seconds=ago), sid]))
    start()
    _fires_until(path, recent, _finished(1), timeout=10)  # due 5 s ago: made up at once
    missed = table.fires(store.cursor(), stale)
    assert missed.status.tolist() == ["missed"]
    assert "while no scheduler was running" in missed.reason.iloc[0]


def test_drift_is_stored_on_the_fire_and_exported_per_schedule(db):
    path, start = db
    service = start()
    schedule_id = service.add(_canary(every_s=3600.0, drift_threshold=0.25))
    table.insert_fire(open_store(path), {  # a previous fire that saw a much later t_sat
        "fire_id": "before", "schedule_id": schedule_id, "due_at": dt.datetime(2026, 1, 1),
        "ended_at": dt.datetime(2026, 1, 1), "status": "finished", "t_sat_s": 10.0})
    service.fire_now(schedule_id)
    fires = _fires_until(path, schedule_id, _finished(2))
    newest = fires.iloc[0]
    assert newest.drifted and newest.t_sat_change < -0.25
    assert "t_sat moved 10 s →" in newest.drift_note
    latest = table.latest_drift(open_store(path).cursor())
    assert latest.schedule_id.tolist() == [schedule_id]
    assert bool(latest.drifted.iloc[0]) and latest.t_sat_change.iloc[0] == newest.t_sat_change


def test_drift_compares_each_metric_with_its_threshold():
    changes, drifted, note = drift({"n_star": 30, "t_sat_s": 4.0},
                                   {"n_star": 33, "t_sat_s": 2.0}, 0.2)
    assert changes == {"n_star": pytest.approx(0.1), "t_sat_s": pytest.approx(-0.5)}
    assert drifted and note.startswith("t_sat moved 4 s → 2 s (-50%") and "N*" not in note
    assert drift({"n_star": None}, {"n_star": 3, "t_sat_s": None}, 0.2) == \
        ({"n_star": None, "t_sat_s": None}, False, None)


def test_n_star_and_retention_fires(db):
    path, start = db
    store = open_store(path)
    old = execute(RunConfig(**CANARY), store)["run_id"]
    long_ago = dt.datetime.now() - dt.timedelta(days=10)
    store.writer.call(lambda con: con.execute(
        "UPDATE runs SET started_at = ?, ended_at = ? WHERE run_id = ?",
        [long_ago, long_ago, old]))
    service = start()
    keep = service.add(ScheduleSpec("retention", "retention", every_s=3600.0,
                                    params={"older_than_days": 7}))
    service.fire_now(keep)
    fire = _fires_until(path, keep, _finished(1)).iloc[0]
    assert fire.reason.startswith("archived 1 run(s) older than 7 days")
    assert list(json.loads(fire.detail)["archived"]) == [old]
    assert archive.archived_runs(path) == [old]

    n_star = service.add(ScheduleSpec(
        "n*", "N* discovery", every_s=3600.0, params={"settings": {
            "engine": "twin", "arrival_rate": 6.0, "session_s": 6.0, "duration_s": 24.0,
            "pool_blocks": 1024}, "window": 128}))
    service.fire_now(n_star)
    fire = _fires_until(path, n_star, _finished(1)).iloc[0]
    assert fire.n_star >= 5


@pytest.mark.parametrize("spec, needle", [
    (dict(kind="nightly"), "schedule kind 'nightly' is not one of canary"),
    (dict(every_s=0.5), "every 0.5 s must be in [1, 31622400] s"),
    (dict(trigger="cron", every_s=None, cron="61 * * * *"), "cron '61 * * * *'"),
    (dict(trigger="cron", every_s=None), "a cron schedule needs a cron expression"),
    (dict(busy_wait_s=-1), "busy wait -1 s must be in [0, 3600] s"),
    (dict(drift_threshold=0), "drift threshold 0 must be in (0, 10]"),
    (dict(params={"settings": {"engine": "twin", "pool_blocks": 0}}), "pool"),
    (dict(params={"settings": {"engine": "twin", "colour": 1}}), "unknown setting"),
    (dict(kind="retention", params={}), "retention age None days must be in"),
    (dict(name=""), "schedule name '' must be 1 to 80 characters"),
])
def test_a_schedule_that_could_never_fire_is_refused_with_the_value(spec, needle):
    args = {"name": "x", "kind": "canary", "every_s": 60.0, "params": {"settings": CANARY},
            **spec}
    with pytest.raises(ValueError) as info:
        ScheduleSpec(**args)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_canary_on_the_live_settings_keeps_them_with_its_own_load(db):
    path, _ = db
    live = RunConfig(engine="vllm", policy="window", window=256, sinks=4, pool_blocks=512,
                     admission="aimd", load="poisson", arrival_rate=3.0, sessions=50,
                     vllm_args=(("gpu_memory_utilization", "0.8"),))
    settings = schedules.canary_settings(json.loads(json.dumps(live.as_dict())), 6, 20.0)
    spec = ScheduleSpec("live canary", "canary", cron="0 3 * * *", trigger="cron",
                        params={"settings": settings})
    (config,) = ScheduleSpec.from_row({**spec.row(), "params": spec.row()["params"]}).configs()
    assert (config.policy, config.window, config.sinks, config.pool_blocks, config.admission) \
        == ("window", 256, 4, 512, "aimd")
    assert (config.load, config.sessions, config.duration_s, config.arrival_rate) == \
        ("fixed", 6, 20.0, None)
    assert config.vllm_args == (("gpu_memory_utilization", "0.8"),)
    assert spec.trigger_text() == "cron 0 3 * * *"
