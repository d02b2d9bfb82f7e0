"""`metronome`: headless experiments and store maintenance. Flags follow DESIGN.md's CLI contract.

stdout carries only the JSON result; logs (ours and vLLM's) go to stderr. Bad input ends with a
one-line `metronome: error: ...` and exit status 2; a run that fails mid-way still prints its
JSON (status "failed") and exits 1, and the database keeps what was recorded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

EXIT_FAILED = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        print(f"metronome: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _run_arguments(run: argparse.ArgumentParser) -> None:
    """The settings of one run: `metronome run` and `metronome forecast` share them."""
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument("--engine", choices=["vllm", "twin"], default="vllm")
    run.add_argument("--model", default="tiny", help="tiny, smollm2 or a local model folder")
    run.add_argument("--db", default=None, help="DuckDB file (default: $METRONOME_DB or metronome.duckdb)")
    # Load fields default to None ("not given"): a replay takes the recording's for those.
    run.add_argument("--seed", type=int, default=None, help="default 0; replay: the recording's")
    run.add_argument("--policy", choices=["unbounded", "window"], default="unbounded")
    run.add_argument("--window", type=int, default=None, help="window tokens (policy window)")
    run.add_argument("--sinks", type=int, default=0, help="attention-sink tokens")
    run.add_argument("--block-size", type=int, default=32)
    run.add_argument("--pool-blocks", type=int, default=256)
    run.add_argument("--max-model-len", type=int, default=None)
    run.add_argument("--frame-ms", type=_positive_float, default=None,
                     help="default 80; replay: the recording's")
    run.add_argument("--budget-ms", type=_positive_float, default=None)
    run.add_argument("--tokens-in", type=int, default=None, help="default 16")
    run.add_argument("--tokens-out", type=int, default=None, help="default 4")
    run.add_argument("--wait-budget", type=_positive_float, default=None,
                     help="gateway mode: answer an empty frame after F·budget")
    run.add_argument("--load", choices=["fixed", "ramp", "poisson", "wav", "mic", "replay"],
                     default="fixed", help="wav: replay --wav-dir; mic: one live session; "
                                           "replay: --replay-run or --replay-trace")
    run.add_argument("--wav-dir", default=None,
                     help="load wav: folder of .wav files; session i replays file i mod count")
    run.add_argument("--wav-loop", action=argparse.BooleanOptionalAction, default=True,
                     help="load wav: loop each file (--no-wav-loop: its session ends with it)")
    run.add_argument("--mic-device", default=None,
                     help="load mic: input device index or name (default: the system's input)")
    run.add_argument("--replay-run", default=None, metavar="RUN_ID",
                     help="load replay: re-offer this recorded run's sessions (same arrivals, "
                          "lengths and tokens) against the settings given here")
    run.add_argument("--replay-trace", default=None, metavar="PATH",
                     help="load replay: a CSV or Parquet trace (session_id, start_s, end_s, "
                          "tokens_in, tokens_out; a row per session or per frame)")
    run.add_argument("--sessions", type=int, default=None, help="default 8")
    run.add_argument("--arrival-rate", type=_positive_float, default=None)
    run.add_argument("--session-s", type=_positive_float, default=None)
    run.add_argument("--duration", type=_positive_float, default=None,
                     help="seconds (default 10)")
    run.add_argument("--stagger", action="store_true", default=None,
                     help="phase-stagger session frames")
    run.add_argument("--paced", action="store_true",
                     help="twin only: run in wall-clock time (demos, soak tests)")
    run.add_argument("--admission", choices=["off", "fixed", "aimd", "gradient"],
                     default="fixed", help="fixed (or off, the CLI contract's name): cap at "
                     "--sessions; aimd/gradient: steer the cap by frame latency")
    run.add_argument("--target", type=_positive_float, default=0.8)
    run.add_argument("--stall-guard", choices=["on", "off"], default="off")
    run.add_argument("--memory-guard", choices=["on", "off"], default="off",
                     help="refuse sessions the pool could not hold for their lifetime")
    run.add_argument("--change", action="append", default=[], metavar="AT:KEY=VALUE",
                     help="change a setting live at AT seconds, as the Controls page does "
                          "(repeatable): window, sinks, policy, target, limit, stall_guard; "
                          "e.g. --change 5:window=32 --change 10:target=0.5")
    run.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                     help="data-parallel ranks, each with its own pool of --pool-blocks")
    run.add_argument("--placement", choices=["engine", "count", "headroom"], default="engine",
                     help="where a new session goes with data parallelism: the engine's own "
                          "balancer, fewest sessions, or the rank whose pool fills last")
    run.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="pass an engine argument to vLLM (repeatable)")
    run.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                     help="serve Prometheus metrics on this port while the run runs "
                          "(our metronome_* and, with vLLM, its vllm:* series)")
    run.add_argument("--metrics-addr", default="127.0.0.1",
                     help="address the metrics endpoint binds (default 127.0.0.1)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="metronome", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one headless experiment")
    _run_arguments(run)

    forecast = sub.add_parser(
        "forecast", help="collapse probability of these settings over many twin seeds "
                         "(unbounded and windowed side by side)")
    _run_arguments(forecast)
    forecast.add_argument("--seeds", type=int, default=200, help="twin runs per policy")
    forecast.add_argument("--compare-window", type=int, default=128,
                          help="W of the windowed side (ignored when --policy window)")

    fit = sub.add_parser("fit-twin", help="fit the twin's cost model from a recorded vLLM run")
    fit.add_argument("run_id")
    fit.add_argument("--db", default=None)
    fit.add_argument("--json", action="store_true")

    cal = sub.add_parser("calibrate", help="measure this machine's step cost and compute "
                                           "limit N_c (kept in the database)")
    demo = sub.add_parser("demo", help="the cliff vs slope demo sized for this machine "
                                       "(calibrates first when it has to)")
    for p in (cal, demo):
        p.add_argument("--engine", choices=["vllm", "twin"], default="vllm")
        p.add_argument("--model", default="tiny", help="tiny, smollm2 or a local model folder")
        p.add_argument("--db", default=None)
        p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    demo.add_argument("--recalibrate", action="store_true",
                      help="calibrate even when a calibration for this machine is stored")
    demo.add_argument("--duration", type=_positive_float, default=None,
                      help="seconds per run (default 18)")
    demo.add_argument("--seed", type=int, default=0)

    runs = sub.add_parser("runs", help="list recorded runs")
    runs.add_argument("--db", default=None)
    runs.add_argument("--limit", type=int, default=20)

    report = sub.add_parser("report", help="write a report of one run or two side by side")
    report.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="one run, or two to compare")
    report.add_argument("--out", required=True, help="FILE.html or FILE.png")
    report.add_argument("--db", default=None)

    quality = sub.add_parser(
        "quality", help="streaming perplexity under full, window-only and sinks+window KV")
    quality.add_argument("--json", action="store_true", help="print the result as one JSON object")
    quality.add_argument("--model", default="smollm2", help="tiny, smollm2 or a local model folder")
    quality.add_argument("--window", type=int, default=256, help="window tokens W")
    quality.add_argument("--sinks", type=int, default=4, help="attention-sink tokens S")
    quality.add_argument("--tokens", type=int, default=4096, help="tokens of text evaluated")
    quality.add_argument("--block-size", type=int, default=32, help="tokens per KV block")
    quality.add_argument("--granularity", choices=["token", "block"], default="block",
                         help="block: the keys vLLM keeps after block-table compaction; "
                              "token: exactly [0, S) and (t-W, t]")
    quality.add_argument("--text", default=None, metavar="PATH",
                         help="text file or folder of fortune files "
                              "(default: Debian's fortunes, else the GPL-3 text)")

    sched = sub.add_parser("scheduler", help="run the schedules headless (no console)")
    sched.add_argument("--db", default=None)
    sched.add_argument("--for", dest="for_s", type=_positive_float, default=None,
                       metavar="SECONDS", help="stop after this long (default: until a signal)")

    schedule = sub.add_parser("schedule", help="define, list, pause, resume or remove schedules")
    schedule_sub = schedule.add_subparsers(dest="action", required=True)
    add = schedule_sub.add_parser("add", help="add a schedule")
    add.add_argument("--db", default=None)
    add.add_argument("--name", required=True)
    add.add_argument("--kind", required=True,
                     choices=["canary", "cliff vs slope", "collapse", "N* discovery",
                              "retention"])
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", type=_positive_float, metavar="SECONDS")
    when.add_argument("--cron", metavar="'MIN HOUR DAY MONTH WEEKDAY'")
    add.add_argument("--settings", default="{}", metavar="JSON",
                     help="RunConfig arguments of the run (canary) or the experiment's base, "
                          'e.g. \'{"engine": "twin", "pool_blocks": 64}\'')
    add.add_argument("--window", type=int, default=128, help="experiments: W of windowed runs")
    add.add_argument("--sinks", type=int, default=0, help="experiments: S of windowed runs")
    add.add_argument("--repeats", type=int, default=3, help="collapse: seeds per policy")
    add.add_argument("--older-than-days", type=_positive_float, default=None,
                     help="retention: archive runs older than this")
    add.add_argument("--busy-wait", type=_positive_float, default=30.0, metavar="SECONDS",
                     help="how long a fire waits for a busy engine before it is skipped")
    add.add_argument("--misfire-grace", type=_positive_float, default=60.0, metavar="SECONDS")
    add.add_argument("--drift-threshold", type=_positive_float, default=0.2,
                     help="relative change of N* or t_sat reported as drift (0.2: 20 %%)")
    add.add_argument("--paused", action="store_true")
    listing = schedule_sub.add_parser("list", help="schedules and their latest fire")
    listing.add_argument("--db", default=None)
    for action in ("pause", "resume", "remove"):
        one = schedule_sub.add_parser(action, help=f"{action} a schedule")
        one.add_argument("schedule_id")
        one.add_argument("--db", default=None)

    archive = sub.add_parser("archive", help="move runs older than an age to Parquet now")
    archive.add_argument("--older-than-days", type=_positive_float, required=True)
    archive.add_argument("--db", default=None)

    build = sub.add_parser("build-model", help="build or convert a bundled model into the cache")
    build.add_argument("name", choices=["tiny", "smollm2"])
    build.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("METRONOME_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        return {"run": _cmd_run, "quality": _cmd_quality, "fit-twin": _cmd_fit, "runs": _cmd_runs,
                "build-model": _cmd_build, "report": _cmd_report, "scheduler": _cmd_scheduler,
                "schedule": _cmd_schedule, "archive": _cmd_archive,
                "forecast": _cmd_forecast, "calibrate": _cmd_calibrate,
                "demo": _cmd_demo}[args.command](args)
    except (ValueError, RuntimeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"metronome: error: {message}", file=sys.stderr)
        return EXIT_USAGE


def run_config_from_args(args) -> "RunConfig":  # noqa: F821 - imported lazily
    from dataclasses import fields

    from app.replay import with_recorded_load
    from engine.config import parse_vllm_args
    from runtime.config import RunConfig, ScheduledChange

    values = dict(
        engine=args.engine, model=args.model, seed=args.seed, policy=args.policy,
        window=args.window, sinks=args.sinks, block_size=args.block_size,
        pool_blocks=args.pool_blocks, max_model_len=args.max_model_len,
        frame_ms=args.frame_ms, budget_ms=args.budget_ms, tokens_in=args.tokens_in,
        tokens_out=args.tokens_out, wait_budget=args.wait_budget, load=args.load,
        sessions=args.sessions, arrival_rate=args.arrival_rate, session_s=args.session_s,
        duration_s=args.duration, stagger=args.stagger, wav_dir=args.wav_dir,
        wav_loop=args.wav_loop, mic_device=args.mic_device, replay_run=args.replay_run,
        replay_trace=args.replay_trace, replay_db=args.db if args.replay_run else None,
        admission="fixed" if args.admission == "off" else args.admission,
        target=args.target, stall_guard=args.stall_guard == "on",
        memory_guard=args.memory_guard == "on", paced=args.paced,
        data_parallel_size=args.data_parallel_size, placement=args.placement,
        vllm_args=parse_vllm_args(args.vllm_arg),
        changes=tuple(ScheduledChange.parse(text) for text in args.change))
    given = {key for key, value in values.items() if value is not None}
    values = with_recorded_load(values, given)
    defaults = {f.name: f.default for f in fields(RunConfig)}
    return RunConfig(**{key: defaults[key] if value is None and key in _LOAD_FLAGS else value
                        for key, value in values.items()})


# Flags whose default is None on the command line so that a replay can tell them apart.
_LOAD_FLAGS = ("seed", "frame_ms", "tokens_in", "tokens_out", "sessions", "duration_s",
               "stagger")


def _cmd_run(args) -> int:
    from runtime import Runner, make_engine
    from store import open_store

    config = run_config_from_args(args)  # validates everything before anything starts
    if config.model not in ("tiny", "smollm2"):
        from engine.models import resolve_model

        resolve_model(config.model)
    exporter = _serve_metrics(args)  # before the engine: a taken port fails in a second
    store = open_store(args.db)
    out = _stdout_for_json()
    engine = make_engine(config, store)
    observers = []
    if exporter is not None:
        exporter.track_store(store.writer)
        observers.append(exporter)
    runner = Runner(config, engine, store, observers=observers)
    if exporter is not None:
        exporter.run_started_for(runner.run_id, config)
    previous = {sig: signal.signal(sig, lambda *_: runner.stop("interrupted by signal"))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = runner.run()
        if exporter is not None:
            exporter.run_ended(runner.run_id, summary)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        engine.shutdown()
        store.close()
    text = json.dumps(summary) if args.json else _human(summary)
    out.write(text + "\n")
    out.flush()
    return 0 if summary["status"] in ("finished", "aborted") else EXIT_FAILED


def _serve_metrics(args):
    """The process's metrics exporter, served on --metrics-port; None without the flag."""
    if args.metrics_port is None:
        return None
    if not 1 <= args.metrics_port <= 65535:
        raise ValueError(f"metrics port {args.metrics_port} must be in [1, 65535]")
    from app.metrics import default_exporter, serve

    serve(args.metrics_port, args.metrics_addr)
    return default_exporter()


def _stdout_for_json():
    """Keep fd 1 for our result only: anything else written to stdout (vLLM's engine process,
    progress bars) is sent to stderr."""
    saved = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    return saved


def _human(summary: dict) -> str:
    keys = ("run_id", "status", "reason", "engine", "policy", "window", "sinks", "frames",
            "silent_rate", "censored_frames", "on_time_rate", "naive_on_time_rate", "p50_ms",
            "p95_ms", "p99_ms", "max_occupancy", "stalled", "stall_at_s", "tsat_pred_s",
            "rows_lost")

    def shown(key):
        if key.endswith("_ms") and summary.get(key.replace("_ms", "_censored")):
            return f"> {summary['budget_ms']:g} (censored: no answer)"
        return summary.get(key)

    lines = [f"{k:>20}: {shown(k)}" for k in keys]
    lines += [f"{'change':>20}: {c['change']} at {c['t']:g} s" for c in summary["changes"]]
    return "\n".join(lines)


def _cmd_forecast(args) -> int:
    from runtime import latest_cost_model
    from runtime.forecast import forecast_pair
    from store import open_store

    config = run_config_from_args(args)
    window = config.window if config.policy == "window" else args.compare_window
    store = open_store(args.db)
    try:
        cost = latest_cost_model(store)  # the twin as fitted to this machine, if it was
    finally:
        store.close()
    pair = forecast_pair(config, window, config.sinks, args.seeds, cost)
    if args.json:
        print(json.dumps({"unbounded": pair[0].as_dict(), "window": pair[1].as_dict(),
                          "twin_cost_source": None if cost is None else cost.source}))
    else:
        print("\n".join(f.sentence() for f in pair))
    return 0


def _cmd_fit(args) -> int:
    import datetime as dt

    from engine.twin import fit_cost_model
    from store import open_store
    from store.queries import run_row, steps

    store = open_store(args.db)
    try:
        cur = store.cursor()
        row = run_row(cur, args.run_id)
        if row is None:
            raise ValueError(f"run {args.run_id!r} is not in {store.path}")
        if row["simulated"]:
            raise ValueError(f"run {args.run_id!r} is simulated; fit the twin from a vLLM run")
        model, facts = fit_cost_model(steps(cur, args.run_id), source=args.run_id)
        store.writer.add("twin_models", {
            "fitted_at": dt.datetime.now(), "source_run_id": args.run_id, "a_ms": model.a_ms,
            "b_ms_per_token": model.b_ms_per_token,
            "c_ms_per_resident_token": model.c_ms_per_resident_token,
            "r2": facts["r2"], "n_steps": facts["n_steps"]})
        store.writer.flush()
    finally:
        store.close()
    result = {"source_run_id": args.run_id, "a_ms": model.a_ms,
              "b_ms_per_token": model.b_ms_per_token,
              "c_ms_per_resident_token": model.c_ms_per_resident_token, **facts}
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


def _progress_to_stderr(fraction: float, text: str) -> None:
    print(f"[{fraction:4.0%}] {text}", file=sys.stderr, flush=True)


def _cmd_calibrate(args) -> int:
    from app.calibration import calibrate
    from store import open_store

    store = open_store(args.db)
    out = _stdout_for_json()
    try:
        result = calibrate(args.engine, args.model, store, progress=_progress_to_stderr)
    finally:
        store.close()
    d = result.as_dict()
    out.write((json.dumps(d) if args.json else "\n".join(f"{k:>24}: {v}" for k, v in d.items()))
              + "\n")
    out.flush()
    return 0


def _cmd_demo(args) -> int:
    """Calibrate if needed, run unbounded then windowed, print both summaries and the story."""
    from dataclasses import asdict

    from app import calibration, demo, story
    from runtime import Runner, make_engine
    from store import open_store

    store = open_store(args.db)
    out = _stdout_for_json()
    try:
        cal = calibration.ensure(store, args.engine, args.model, _progress_to_stderr,
                                 recalibrate=args.recalibrate)
        settings = demo.derive(cal, args.duration or demo.DURATION_S)
        summaries = []
        for config in settings.configs(args.engine, args.model, args.seed):
            _progress_to_stderr(len(summaries) / 2, f"demo run {len(summaries) + 1} of 2: "
                                                    f"{config.policy}")
            engine = make_engine(config, store)
            try:
                summaries.append(Runner(config, engine, store).run())
            finally:
                engine.shutdown()
        store.writer.flush()
        cur = store.cursor()
        after = [story.silent_after_stall(cur, s) for s in summaries]
        result = {"calibration": cal.as_dict(), "settings": asdict(settings),
                  "runs": summaries, "silent_after_stall": after,
                  "sentences": [story.sentence(s, a) for s, a in zip(summaries, after)],
                  "story": story.story(cur, *summaries)}
    finally:
        store.close()
    if args.json:
        out.write(json.dumps(result, default=str) + "\n")
    else:
        out.write("\n\n".join([_human(s) for s in summaries] + [result["story"]]) + "\n")
    out.flush()
    failed = any(s["status"] not in ("finished", "aborted") for s in summaries)
    return EXIT_FAILED if failed else 0


def _cmd_runs(args) -> int:
    from store import open_store
    from store.queries import runs

    store = open_store(args.db)
    try:
        df = runs(store.cursor(), args.limit)
    finally:
        store.close()
    print(df.drop(columns=["summary"]).to_string(index=False) if not df.empty else "no runs")
    return 0


def _cmd_report(args) -> int:
    from app import report
    from store import open_store

    store = open_store(args.db)
    try:
        path = report.write(store.cursor(), args.run_ids, args.out)
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
    out = _stdout_for_json()
    result = measure(settings)
    text = (json.dumps(result) if args.json
            else "\n".join(f"{k:>22}: {v}" for k, v in result.items()))
    out.write(text + "\n")
    out.flush()
    return 0


def _cmd_scheduler(args) -> int:
    import threading

    from app.engine_host import RunHost
    from app.scheduler import SchedulerService
    from store import open_store

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
    from app import scheduler
    from app.schedules import ScheduleSpec
    from store import open_store
    from store import schedules as table

    store = open_store(args.db)
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
                spec = ScheduleSpec.from_row(row)
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
    from store import archive, open_store

    store = open_store(args.db)
    try:
        results = archive.archive_older_than(store, args.older_than_days * 86400.0)
    finally:
        store.close()
    for r in results:
        print(f"{r.run_id}  {r.status}  " + (r.path or r.reason or ""))
    if not results:
        print("no runs that old")
    return 0 if all(r.status == "archived" for r in results) else EXIT_FAILED


def _cmd_build(args) -> int:
    from engine.models import build_smollm2, build_tiny

    path = build_tiny(args.seed) if args.name == "tiny" else build_smollm2()
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
