"""The scheduler: APScheduler jobs built from the schedules table, firing on the run host.

The schedules table (store/schedules.py) is the source of truth; APScheduler only keeps the
jobs built from it for as long as this process runs. So its jobs live in a MemoryJobStore:
a persistent APScheduler store would be a second copy of every schedule (pickled, and needing
SQLAlchemy, which DuckDB's single-writer file does not want), and the two could disagree after
a crash. At start every schedule becomes a job again; a fire that came due while no scheduler
ran is made up once if it is within the schedule's misfire grace, else recorded as missed.

One run at a time: a fire asks the run host, and a busy host (an operator's run, another
schedule's) makes it wait up to the schedule's busy_wait_s, polling, and then skip; either way
the reason is on the fire row. APScheduler adds the rest: max_instances=1 (a fire that comes
due while the previous one still runs is skipped and recorded), coalesce=True (fires piled up
behind a stalled scheduler run once) and misfire_grace_time (a fire reached too late is
recorded as missed, not run at a surprising time).

Runs in the console's process (one per database, console/shell.py) or headless
(`metronome scheduler`). Nothing here imports Streamlit.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from services.run_host import RunHost
from services.schedule_fire import Fire
from services.schedule_specs import ScheduleSpec, spec_or_problem
from store import open_store
from store import schedules as table

logger = logging.getLogger(__name__)

POLL_S = 0.1  # how often a fire looks at the run host while it waits
WORKERS = 4  # fires in flight at once (they mostly wait: runs are one at a time anyway)


def new_schedule_id() -> str:
    return f"sch-{uuid.uuid4().hex[:8]}"


def add_schedule(store, spec: ScheduleSpec, paused: bool = False) -> str:
    """Write a schedule to the table (a running scheduler also needs SchedulerService.add)."""
    schedule_id = new_schedule_id()
    table.insert_schedule(store, {"schedule_id": schedule_id, **spec.row(), "paused": paused,
                                  "created_at": dt.datetime.now()})
    return schedule_id


def existing(cur, schedule_id: str) -> dict:
    row = table.schedule(cur, schedule_id)
    if row is None:
        raise ValueError(f"schedule {schedule_id!r} does not exist")
    return row


def _trigger(spec: ScheduleSpec):
    if spec.trigger == "interval":
        return IntervalTrigger(seconds=spec.every_s)
    return CronTrigger.from_crontab(spec.cron)


def _aware(naive: dt.datetime) -> dt.datetime:
    """The store's local wall time as an aware datetime (what APScheduler's triggers use)."""
    return naive.astimezone()


class SchedulerService:
    def __init__(self, host: RunHost, db_path: str, poll_s: float = POLL_S) -> None:
        self.host = host
        self.store = open_store(db_path)
        self.db_path = self.store.path
        self.poll_s = poll_s
        self._scheduler: BackgroundScheduler | None = None
        self._specs: dict[str, ScheduleSpec] = {}
        self.invalid: dict[str, str] = {}  # schedule id → why it cannot run (skipped)
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "SchedulerService":
        with self._lock:
            if self._scheduler is not None:
                return self
            self._stopping.clear()
            interrupted = table.interrupt_running_fires(
                self.store, "the scheduler stopped before this fire ended")
            if interrupted:
                logger.warning("%d fire(s) were interrupted by the last scheduler's end",
                               interrupted)
            scheduler = BackgroundScheduler(
                jobstores={"default": MemoryJobStore()},
                executors={"default": ThreadPoolExecutor(WORKERS)},
                job_defaults={"coalesce": True, "max_instances": 1})
            scheduler.add_listener(self._on_event, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED
                                   | EVENT_JOB_ERROR)
            self._scheduler = scheduler
            rows = table.schedules(self.store.cursor())
            for row in rows:
                self._restore(row)
            scheduler.start()
        logger.info("scheduler started on %s with %d schedule(s)", self.db_path, len(rows))
        return self

    def shutdown(self, wait: bool = False) -> None:
        """Stop firing. Fires waiting for the engine give up; a run already started goes on
        in the run host (its fire row is marked interrupted)."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
            self._stopping.set()
        if scheduler is not None:
            scheduler.shutdown(wait=wait)
            logger.info("scheduler on %s stopped", self.db_path)

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def _restore(self, row: dict) -> None:
        schedule_id = row["schedule_id"]
        spec, problem = spec_or_problem(row)
        if row.get("invalid") != problem:
            table.set_invalid(self.store, schedule_id, problem)
        if spec is None:  # skipped, marked: the other schedules still fire
            self.invalid[schedule_id] = problem
            logger.error("schedule %s (%s) is invalid and skipped: %s", schedule_id,
                         row.get("name"), problem)
            return
        self._specs[schedule_id] = spec
        catch_up = False
        if not row["paused"]:
            catch_up = self._came_due_while_down(schedule_id, spec, row["created_at"])
        self._add_job(schedule_id, spec, row["paused"], catch_up)

    def _came_due_while_down(self, schedule_id: str, spec: ScheduleSpec,
                             created_at: dt.datetime) -> bool:
        """Whether a fire came due while no scheduler ran: True to make it up now (within the
        misfire grace, once however many were missed), else recorded as missed."""
        last = table.last_due(self.store.cursor(), schedule_id) or created_at
        now = dt.datetime.now().astimezone()
        due = _trigger(spec).get_next_fire_time(_aware(last), _aware(last))
        if due is None or due >= now:
            return False
        late_s = (now - due).total_seconds()
        if late_s <= spec.misfire_grace_s:
            return True
        table.insert_fire(self.store, {
            "fire_id": uuid.uuid4().hex, "schedule_id": schedule_id,
            "due_at": due.replace(tzinfo=None), "status": "missed",
            "reason": f"came due while no scheduler was running; {late_s:.0f} s late is past "
                      f"the {spec.misfire_grace_s:g} s misfire grace (later misses coalesced)"})
        return False

    def _add_job(self, schedule_id: str, spec: ScheduleSpec, paused: bool,
                 catch_up: bool = False) -> None:
        kwargs = {}
        if paused:
            kwargs["next_run_time"] = None  # APScheduler's paused job
        elif catch_up:
            kwargs["next_run_time"] = dt.datetime.now().astimezone()
        self._scheduler.add_job(
            self._fire, _trigger(spec), args=[schedule_id], id=schedule_id, name=spec.name,
            misfire_grace_time=max(1, round(spec.misfire_grace_s)), coalesce=True,
            max_instances=1, replace_existing=True, **kwargs)

    # --- operator actions (any thread) --------------------------------------------------------
    def add(self, spec: ScheduleSpec, paused: bool = False) -> str:
        schedule_id = add_schedule(self.store, spec, paused)
        with self._lock:
            self._specs[schedule_id] = spec
            if self._scheduler is not None:
                self._add_job(schedule_id, spec, paused)
        logger.info("schedule %s (%s, %s) added", schedule_id, spec.name, spec.trigger_text())
        return schedule_id

    def pause(self, schedule_id: str) -> None:
        existing(self.store.cursor(), schedule_id)
        table.set_paused(self.store, schedule_id, True)
        with self._lock:
            if self._scheduler is not None and schedule_id not in self.invalid:
                self._scheduler.pause_job(schedule_id)

    def resume(self, schedule_id: str) -> None:
        existing(self.store.cursor(), schedule_id)
        self._refuse_invalid(schedule_id)
        table.set_paused(self.store, schedule_id, False)
        with self._lock:
            if self._scheduler is not None:
                self._scheduler.resume_job(schedule_id)

    def remove(self, schedule_id: str) -> None:
        existing(self.store.cursor(), schedule_id)
        with self._lock:
            self._specs.pop(schedule_id, None)
            self.invalid.pop(schedule_id, None)
            if self._scheduler is not None and self._scheduler.get_job(schedule_id):
                self._scheduler.remove_job(schedule_id)
        table.delete_schedule(self.store, schedule_id)

    def fire_now(self, schedule_id: str) -> None:
        """Bring the next fire forward to now (then the trigger's times go on as before)."""
        row = existing(self.store.cursor(), schedule_id)
        self._refuse_invalid(schedule_id)
        if row["paused"]:
            raise ValueError(f"schedule {row['name']} is paused; resume it first")
        with self._lock:
            if self._scheduler is None:
                raise ValueError("the scheduler is not running")
            self._scheduler.modify_job(schedule_id, next_run_time=dt.datetime.now().astimezone())

    def _refuse_invalid(self, schedule_id: str) -> None:
        if schedule_id in self.invalid:
            raise ValueError(f"schedule {schedule_id} is invalid ({self.invalid[schedule_id]}); "
                             "remove it and add it again")

    def next_fire_times(self) -> dict[str, dt.datetime | None]:
        """Each schedule's next fire (local time, no zone); None while paused."""
        with self._lock:
            if self._scheduler is None:
                return {}
            jobs = self._scheduler.get_jobs()
        return {job.id: None if job.next_run_time is None
                else job.next_run_time.astimezone().replace(tzinfo=None) for job in jobs}

    # --- APScheduler's own skips ----------------------------------------------------------------
    def _on_event(self, event) -> None:
        if event.code == EVENT_JOB_ERROR:
            logger.error("schedule %s: the fire raised %r", event.job_id, event.exception)
            return
        if event.code == EVENT_JOB_MAX_INSTANCES:
            due = event.scheduled_run_times[-1]
            status, reason = "skipped", ("the previous fire of this schedule is still running "
                                         "(one fire at a time)")
        else:  # EVENT_JOB_MISSED
            due = event.scheduled_run_time
            spec = self._specs.get(event.job_id)
            late_s = (dt.datetime.now().astimezone() - due).total_seconds()
            grace = f"{spec.misfire_grace_s:g}" if spec else "?"
            status, reason = "missed", (f"the scheduler reached it {late_s:.1f} s after it was "
                                        f"due, past the {grace} s misfire grace")
        try:
            table.insert_fire(self.store, {
                "fire_id": uuid.uuid4().hex, "schedule_id": event.job_id,
                "due_at": due.astimezone().replace(tzinfo=None), "status": status,
                "reason": reason})
        except Exception:  # noqa: BLE001 - the scheduler thread must survive a store error
            logger.exception("schedule %s: could not record a %s fire", event.job_id, status)
        logger.warning("schedule %s %s: %s", event.job_id, status, reason)

    # --- a fire (APScheduler's worker thread) ---------------------------------------------------
    def _fire(self, schedule_id: str) -> None:
        spec = self._specs.get(schedule_id)
        if spec is None:
            return  # removed between its submission and now
        Fire(self.host, self.store, self.poll_s, self._stopping).run(schedule_id, spec)
