"""One fire of a schedule: retention, or its runs started on the run host once it is free
(waiting up to the schedule's busy wait, else skipped with the reason), then their
measurements and drift on the fire row. services/scheduler.py decides when a fire happens."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid

from services.run_host import ACTIVE, RunHost, one_line
from services.schedule_specs import ScheduleSpec, drift, fire_metrics
from store import archive, queries
from store import schedules as table

logger = logging.getLogger(__name__)


class Fire:
    """What a fire does, in APScheduler's worker thread; `stopping` is the scheduler's."""

    def __init__(self, host: RunHost, store, poll_s: float, stopping: threading.Event) -> None:
        self.host = host
        self.store = store
        self.db_path = store.path
        self.poll_s = poll_s
        self._stopping = stopping

    def run(self, schedule_id: str, spec: ScheduleSpec) -> None:
        """Do the fire, its outcome on its fire row (a failure too)."""
        fire_id = uuid.uuid4().hex
        due = dt.datetime.now()
        try:
            if spec.kind == "retention":
                self._retention(schedule_id, fire_id, due, spec)
            else:
                self._runs(schedule_id, fire_id, due, spec)
        except Exception as exc:  # noqa: BLE001 - recorded on the fire row, then logged
            logger.exception("schedule %s: fire %s failed", schedule_id, fire_id)
            self._record_failure(schedule_id, fire_id, due, one_line(exc))

    def _record_failure(self, schedule_id: str, fire_id: str, due: dt.datetime,
                        reason: str) -> None:
        try:
            if table.fires(self.store.cursor(), schedule_id).fire_id.eq(fire_id).any():
                table.update_fire(self.store, fire_id, status="failed", reason=reason,
                                  ended_at=dt.datetime.now())
            else:
                table.insert_fire(self.store, {
                    "fire_id": fire_id, "schedule_id": schedule_id, "due_at": due,
                    "ended_at": dt.datetime.now(), "status": "failed", "reason": reason})
        except Exception:  # noqa: BLE001
            logger.exception("schedule %s: could not record the failure", schedule_id)

    def _retention(self, schedule_id: str, fire_id: str, due: dt.datetime,
                   spec: ScheduleSpec) -> None:
        table.insert_fire(self.store, {"fire_id": fire_id, "schedule_id": schedule_id,
                                       "due_at": due, "started_at": dt.datetime.now(),
                                       "status": "running", "run_ids": []})
        days = float(spec.params["older_than_days"])
        results = archive.archive_older_than(self.store, days * 86400.0)
        moved = [r for r in results if r.status == "archived"]
        kept = {r.run_id: r.reason for r in results if r.status != "archived"}
        reason = f"archived {len(moved)} run(s) older than {days:g} days"
        if kept:
            reason += f"; kept {len(kept)} in the database: {next(iter(kept.values()))}"
        table.update_fire(self.store, fire_id, status="finished", ended_at=dt.datetime.now(),
                          reason=reason,
                          detail={"archived": {r.run_id: r.rows for r in moved}, "kept": kept})

    def _runs(self, schedule_id: str, fire_id: str, due: dt.datetime,
              spec: ScheduleSpec) -> None:
        configs = spec.configs()
        started = self._start_when_free(schedule_id, fire_id, due, spec, configs)
        if started is None:
            return
        run_ids, waited_s, busy_with = started
        reason = (f"delayed {waited_s:.1f} s: the engine was busy with run {busy_with}"
                  if busy_with else None)
        table.insert_fire(self.store, {
            "fire_id": fire_id, "schedule_id": schedule_id, "due_at": due,
            "started_at": dt.datetime.now(), "status": "running", "reason": reason,
            "run_ids": run_ids, "detail": {"waited_s": round(waited_s, 3)}})
        if not self._wait_for_series(run_ids):
            table.update_fire(self.store, fire_id, status="interrupted",
                              ended_at=dt.datetime.now(),
                              reason="the scheduler stopped while the fire's runs went on")
            return
        self.store.writer.flush()
        cur = self.store.cursor()
        rows = [queries.run_row(cur, run_id) for run_id in run_ids]
        problems = [f"run {run_id} " + ("did not run (its series stopped)" if row is None else
                                        f"{row['status']}: {row['reason']}")
                    for run_id, row in zip(run_ids, rows)
                    if row is None or row["status"] != "finished"]
        finished = [row for row in rows if row is not None and row["status"] == "finished"]
        metrics = fire_metrics(cur, spec.kind, finished)
        changes, drifted, note = drift(table.previous_metrics(cur, schedule_id, fire_id),
                                       metrics, spec.drift_threshold)
        if drifted:
            logger.warning("schedule %s (%s) drifted: %s", schedule_id, spec.name, note)
        table.update_fire(
            self.store, fire_id, status="failed" if problems else "finished",
            ended_at=dt.datetime.now(),
            reason="; ".join(filter(None, [reason, *problems])) or None,
            n_star=metrics["n_star"], t_sat_s=metrics["t_sat_s"],
            n_star_change=changes["n_star"], t_sat_change=changes["t_sat_s"],
            drifted=drifted, drift_note=note)

    def _start_when_free(self, schedule_id, fire_id, due, spec, configs):
        """Start the fire's runs once the host is free: (run ids, seconds waited, the run it
        waited for) — or None after recording the skip."""
        t0 = time.monotonic()
        busy_with = None
        while True:
            state = self.host.state()
            if state.status not in ACTIVE:
                try:
                    run_ids = self.host.start_series(configs, self.db_path,
                                                     kind=f"schedule {spec.name}")
                    return run_ids, time.monotonic() - t0, busy_with
                except ValueError:
                    state = self.host.state()  # another start won the race
                    if state.status not in ACTIVE:
                        raise
            busy_with = state.run_id
            waited = time.monotonic() - t0
            if self._stopping.is_set() or waited >= spec.busy_wait_s:
                why = ("the scheduler stopped while it waited" if self._stopping.is_set() else
                       f"waited {waited:.1f} s of its {spec.busy_wait_s:g} s busy wait")
                table.insert_fire(self.store, {
                    "fire_id": fire_id, "schedule_id": schedule_id, "due_at": due,
                    "ended_at": dt.datetime.now(), "status": "skipped",
                    "reason": f"the engine was busy with run {busy_with} ({state.status}); "
                              f"{why}; a fire never runs on top of another run"})
                logger.info("schedule %s skipped: engine busy with run %s", schedule_id,
                            busy_with)
                return None
            self._stopping.wait(self.poll_s)

    def _wait_for_series(self, run_ids: list[str]) -> bool:
        """Until the host has finished our runs (True), or the scheduler stops (False)."""
        while not self._stopping.is_set():
            state = self.host.state()
            if state.status not in ACTIVE or state.run_id not in run_ids:
                return True
            self._stopping.wait(self.poll_s)
        return False
