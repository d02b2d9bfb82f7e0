"""`metronome runs`, `report`, `quality`, `scheduler`, `schedule`, `archive` and `build-model`:
the commands that read or maintain the store and the model cache."""

from __future__ import annotations

import json
import logging
import signal

from cli.run_commands import EXIT_FAILED, stdout_for_json


MAX_LIST = 100_000  # rows `runs --limit` prints
MAX_SCHEDULER_S = 366 * 86400.0  # `scheduler --for`: a year; longer is "until a signal"


def _cmd_runs(args) -> int:
    from store import open_reader
    from store.queries import runs

    if not 1 <= args.limit <= MAX_LIST:
        raise ValueError(f"limit {args.limit} must be in [1, {MAX_LIST}]")
    store = open_reader(args.db)
    try:
        df = runs(store.cursor(), args.limit)
    finally:
        store.close()
    print(df.drop(columns=["summary"]).to_string(index=False) if not df.empty else "no runs")
    return 0


def _cmd_report(args) -> int:
    from services import report
    from store import Store, open_reader

    store = open_reader(args.db)
    try:  # through the holder, its runs are rolled up by it: no store to build them in
        path = report.write(store.cursor(), args.run_ids, args.out,
                            store if isinstance(store, Store) else None)
    finally:
        store.close()
    print(path)
    return 0


def _cmd_quality(args) -> int:
    from engine.quality import QualitySettings, measure

    settings = QualitySettings(  # validates everything before the model loads
        model=args.model, window_tokens=args.window, sink_tokens=args.sinks,
        n_tokens=args.tokens, block_size=args.block_size, granularity=args.granularity,
        text_path=args.text)
    out = stdout_for_json()
    result = measure(settings)
    text = (json.dumps(result) if args.json
            else "\n".join(f"{k:>22}: {v}" for k, v in result.items()))
    out.write(text + "\n")
    out.flush()
    return 0


def _cmd_scheduler(args) -> int:
    import threading

    from services.run_host import RunHost
    from services.scheduler import SchedulerService
    from store import open_store

    if args.for_s is not None and not 0 < args.for_s <= MAX_SCHEDULER_S:  # nan and inf too
        raise ValueError(f"--for {args.for_s:g} s must be in (0, {MAX_SCHEDULER_S:.0f}] s (a "
                         "year); leave it out to run until a signal")
    store = open_store(args.db)
    host = RunHost()
    service = SchedulerService(host, store.path).start()
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for schedule_id, at in sorted(service.next_fire_times().items()):
            logging.getLogger(__name__).info("schedule %s: next fire %s", schedule_id,
                                             "paused" if at is None else f"{at:%Y-%m-%d %H:%M:%S}")
        done.wait(args.for_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        service.shutdown()
        host.close()
        store.close()
    return 0


def _cmd_schedule(args) -> int:
    from services import scheduler
    from services.schedule_specs import ScheduleSpec, spec_or_problem
    from store import open_existing, open_reader, open_store
    from store import schedules as table

    # Adding may create the database; listing or changing a schedule needs one that exists;
    # listing reads through the console that holds it, if one does.
    store = {"add": open_store, "list": open_reader}.get(args.action, open_existing)(args.db)
    try:
        if args.action == "add":
            try:
                settings = json.loads(args.settings)
            except json.JSONDecodeError as exc:
                raise ValueError(f"settings {args.settings!r} is not JSON: {exc.msg}") from None
            params = ({"older_than_days": args.older_than_days} if args.kind == "retention"
                      else {"settings": settings, "window": args.window, "sinks": args.sinks,
                            "repeats": args.repeats})
            spec = ScheduleSpec(
                name=args.name, kind=args.kind, trigger="cron" if args.cron else "interval",
                every_s=args.every, cron=args.cron, params=params,
                misfire_grace_s=args.misfire_grace, busy_wait_s=args.busy_wait,
                drift_threshold=args.drift_threshold)
            print(scheduler.add_schedule(store, spec, paused=args.paused))
        elif args.action == "list":
            rows = table.schedules(store.cursor())
            drift = table.latest_drift(store.cursor()).set_index("schedule_id")
            for row in rows:
                spec, problem = spec_or_problem(row)
                if spec is None:
                    print(f"{row['schedule_id']}  INVALID {row['name']} · {row['kind']}: "
                          f"{problem} (skipped by the scheduler)")
                    continue
                last = drift.loc[row["schedule_id"]] if row["schedule_id"] in drift.index \
                    else None
                note = "" if last is None else (
                    f"  last fire: N* {_shown(last.n_star, '.0f')} t_sat "
                    f"{_shown(last.t_sat_s, '.2f')} s"
                    + (f"  DRIFT: {last.drift_note}" if last.drifted else ""))
                print(f"{row['schedule_id']}  {'paused ' if row['paused'] else ''}"
                      f"{spec.name} · {spec.kind} · {spec.trigger_text()}{note}")
            if not rows:
                print("no schedules")
        else:
            scheduler.existing(store.cursor(), args.schedule_id)
            if args.action == "remove":
                table.delete_schedule(store, args.schedule_id)
            else:
                table.set_paused(store, args.schedule_id, args.action == "pause")
            print(f"{args.schedule_id} {args.action}d")
    finally:
        store.close()
    return 0


def _shown(value, fmt: str) -> str:
    import math

    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, fmt)


def _cmd_archive(args) -> int:
    from store import archive, open_existing

    age_s = args.older_than_days * 86400.0
    if not 0 < age_s <= archive.MAX_AGE_S:  # before the database is opened; nan and inf too
        raise ValueError(f"--older-than-days {args.older_than_days:g} must be in "
                         f"(0, {archive.MAX_AGE_S / 86400:.0f}] days")
    store = open_existing(args.db)
    try:
        results = archive.archive_older_than(store, age_s)
    finally:
        store.close()
    for r in results:
        print(f"{r.run_id}  {r.status}  " + (r.path or r.reason or ""))
    if not results:
        print("no runs that old")
    return 0 if all(r.status == "archived" for r in results) else EXIT_FAILED


def _cmd_build(args) -> int:
    from engine.models import build_asr_tiny, build_smollm2, build_tiny

    path = build_tiny(args.seed) if args.name == "tiny" else \
        build_asr_tiny(args.seed) if args.name == "asr-tiny" else build_smollm2()
    print(path)
    return 0
