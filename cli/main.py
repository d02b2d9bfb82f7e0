"""`metronome`: headless experiments and store maintenance. Flags follow DESIGN.md's CLI contract.

stdout carries only the JSON result; logs (ours and vLLM's) go to stderr. Bad input ends with a
one-line `metronome: error: ...` and exit status 2; a run that fails mid-way still prints its
JSON (status "failed") and exits 1, and the database keeps what was recorded.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from cli.gateway_commands import add_parsers as _gateway_parsers
from cli.gateway_commands import cmd_load as _cmd_load
from cli.gateway_commands import cmd_serve as _cmd_serve
from cli.run_commands import (
    EXIT_FAILED,
    EXIT_USAGE,
    _cmd_calibrate,
    _cmd_demo,
    _cmd_fit,
    _cmd_forecast,
    _cmd_run,
    run_config_from_args,
)
from cli.store_commands import (
    _cmd_archive,
    _cmd_build,
    _cmd_quality,
    _cmd_report,
    _cmd_runs,
    _cmd_schedule,
    _cmd_scheduler,
)

__all__ = ["EXIT_FAILED", "EXIT_USAGE", "build_parser", "main", "run_config_from_args"]


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
    """The settings of one run: `metronome run` and `metronome forecast` share them. Every
    default is RunConfig's own (one definition; the Load page's form reads them too)."""
    from dataclasses import fields

    from runtime.config import RunConfig

    d = {f.name: f.default for f in fields(RunConfig)}
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument("--engine", choices=["vllm", "twin"], default=d["engine"])
    run.add_argument("--model", default=d["model"], help="tiny, smollm2 or a local model folder")
    run.add_argument("--db", default=None, help="DuckDB file (default: $METRONOME_DB or metronome.duckdb)")
    # Load fields default to None ("not given"): a replay takes the recording's for those.
    run.add_argument("--seed", type=int, default=None,
                     help=f"default {d['seed']}; replay: the recording's")
    run.add_argument("--policy", choices=["unbounded", "window"], default=d["policy"])
    run.add_argument("--window", type=int, default=None, help="window tokens (policy window)")
    run.add_argument("--sinks", type=int, default=d["sinks"], help="attention-sink tokens")
    run.add_argument("--block-size", type=int, default=d["block_size"])
    run.add_argument("--pool-blocks", type=int, default=d["pool_blocks"])
    run.add_argument("--max-model-len", type=int, default=None)
    run.add_argument("--frame-ms", type=_positive_float, default=None,
                     help=f"default {d['frame_ms']:g}; replay: the recording's")
    run.add_argument("--budget-ms", type=_positive_float, default=None)
    run.add_argument("--tokens-in", type=int, default=None, help=f"default {d['tokens_in']}")
    run.add_argument("--tokens-out", type=int, default=None, help=f"default {d['tokens_out']}")
    run.add_argument("--wait-budget", type=_positive_float, default=None,
                     help="gateway mode: answer an empty frame after F·budget")
    run.add_argument("--load", choices=["fixed", "ramp", "poisson", "wav", "mic", "replay"],
                     default=d["load"], help="wav: replay --wav-dir; mic: one live session; "
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
    run.add_argument("--sessions", type=int, default=None, help=f"default {d['sessions']}")
    run.add_argument("--arrival-rate", type=_positive_float, default=None)
    run.add_argument("--session-s", type=_positive_float, default=None)
    run.add_argument("--duration", type=_positive_float, default=None,
                     help=f"seconds (default {d['duration_s']:g})")
    run.add_argument("--stagger", action="store_true", default=None,
                     help="phase-stagger session frames")
    run.add_argument("--paced", action="store_true",
                     help="twin only: run in wall-clock time (demos, soak tests)")
    run.add_argument("--admission", choices=["off", "fixed", "aimd", "gradient"],
                     default=d["admission"], help="fixed (or off, the CLI contract's name): cap at "
                     "--sessions; aimd/gradient: steer the cap by frame latency")
    run.add_argument("--target", type=_positive_float, default=d["target"])
    run.add_argument("--stall-guard", choices=["on", "off"],
                     default="on" if d["stall_guard"] else "off")
    run.add_argument("--memory-guard", choices=["on", "off"],
                     default="on" if d["memory_guard"] else "off",
                     help="refuse sessions the pool could not hold for their lifetime")
    run.add_argument("--change", action="append", default=[], metavar="AT:KEY=VALUE",
                     help="change a setting live at AT seconds, as the Controls page does "
                          "(repeatable): window, sinks, policy, target, limit, stall_guard; "
                          "e.g. --change 5:window=32 --change 10:target=0.5")
    run.add_argument("--data-parallel-size", type=int, default=d["data_parallel_size"],
                     metavar="N",
                     help="data-parallel ranks, each with its own pool of --pool-blocks")
    run.add_argument("--placement", choices=["engine", "count", "headroom"],
                     default=d["placement"],
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

    _gateway_parsers(sub, _run_arguments, _positive_float)

    build = sub.add_parser("build-model", help="build or convert a bundled model into the cache")
    build.add_argument("name", choices=["tiny", "smollm2", "asr-tiny"])
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
                "demo": _cmd_demo, "serve": _cmd_serve, "load": _cmd_load}[args.command](args)
    except (ValueError, RuntimeError, OSError) as exc:  # OSError: a path the OS refused
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"metronome: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
