"""`metronome run`, `forecast`, `fit-twin`, `calibrate` and `demo`: the commands that run an
engine. Parsing lives in cli/main.py; stdout carries only the JSON result (vLLM's output is sent
to stderr by `stdout_for_json`)."""

from __future__ import annotations

import json
import os
import signal
import sys

EXIT_FAILED = 1
EXIT_USAGE = 2


def run_config_from_args(args) -> "RunConfig":  # noqa: F821 - imported lazily
    """The flags as RunConfig's fields (a flag left out is None: not given), made a RunConfig
    the one way every caller does (services.replay_settings.run_config)."""
    from engine.config import parse_vllm_args
    from runtime.config import ScheduledChange
    from services.replay_settings import run_config

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
    return run_config(values, given={key for key, value in values.items() if value is not None})


def _cmd_run(args) -> int:
    from runtime import Runner, make_engine
    from store import open_store

    config = run_config_from_args(args)  # validates everything before anything starts
    if config.model not in ("tiny", "smollm2"):
        from engine.models import resolve_model

        resolve_model(config.model)
    exporter = _serve_metrics(args)  # before the engine: a taken port fails in a second
    store = open_store(args.db)
    out = stdout_for_json()
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
        summary = runner.run()  # records its own failures: it returns a summary
        if exporter is not None:
            exporter.run_ended(runner.run_id, summary)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        engine.shutdown()
        closed = store.close()
    text = json.dumps(summary) if args.json else _human(summary)
    out.write(text + "\n")
    out.flush()
    if summary["status"] == "failed":
        print(f"metronome: error: run {summary['run_id']} failed: {summary['reason']}",
              file=sys.stderr)
    if not closed:
        print(f"metronome: error: the store {store.path} did not finish writing; rows still "
              "queued were counted lost", file=sys.stderr)
    return 0 if summary["status"] in ("finished", "aborted") else EXIT_FAILED


def _serve_metrics(args):
    """The process's metrics exporter, served on --metrics-port; None without the flag."""
    if args.metrics_port is None:
        return None
    if not 1 <= args.metrics_port <= 65535:
        raise ValueError(f"metrics port {args.metrics_port} must be in [1, 65535]")
    from metrics import default_exporter, serve

    serve(args.metrics_port, args.metrics_addr)
    return default_exporter()


def stdout_for_json():
    """Keep fd 1 for our result only: anything else written to stdout (vLLM's engine process,
    progress bars) is sent to stderr."""
    saved = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    return saved


def _human(summary: dict) -> str:
    keys = ("run_id", "status", "reason", "engine", "dtype", "policy", "window", "sinks", "frames",
            "silent_rate", "censored_frames", "on_time_rate", "naive_on_time_rate", "p50_ms",
            "p95_ms", "p99_ms", "max_occupancy", "stalled", "stall_at_s", "tsat_pred_s",
            "rows_lost")

    def shown(key):
        if key.endswith("_ms") and summary.get(key.replace("_ms", "_censored")):
            return f"> {summary['budget_ms']:g} (censored: no answer)"
        return summary.get(key)

    # What the model was fed (runtime/inputs.py): an audio-in model's encoder counts too.
    keys += tuple(k for k in ("input_path", "input", "encoder_frames_per_frame",
                              "audio_tokens_per_frame", "encoder_ms_per_frame")
                  if summary.get(k) is not None)
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

    from engine.twin_cost import fit_cost_model
    from store import open_existing
    from store.queries import run_row, steps

    store = open_existing(args.db)
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
    from services.calibration import calibrate
    from store import open_store

    store = open_store(args.db)
    out = stdout_for_json()
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

    from services import calibration
    from services import demo
    from services import story
    from runtime import run_series
    from store import open_store

    store = open_store(args.db)
    out = stdout_for_json()
    try:
        cal = calibration.ensure(store, args.engine, args.model, _progress_to_stderr,
                                 recalibrate=args.recalibrate)
        settings = demo.derive(cal, args.duration)
        configs = settings.configs(args.engine, args.model, args.seed)
        summaries = run_series(configs, store, before=lambda i, config: _progress_to_stderr(
            i / len(configs), f"demo run {i + 1} of {len(configs)}: {config.policy}"))
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
