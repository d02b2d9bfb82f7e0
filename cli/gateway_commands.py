"""`metronome serve` (the gateway, headless) and `metronome load` (the load client for any
realtime server): their arguments and commands. The work lives in gateway/."""

from __future__ import annotations

import json
import os

SERVE_DURATION_S = 3600.0  # serve's default run length: an hour of sessions


def add_parsers(sub, run_arguments, number) -> None:
    from gateway.client_protocols import PROTOCOLS  # no dependencies: cheap at parse time

    serve = sub.add_parser("serve", help="serve sessions over WebSocket (/v1/realtime) as one "
                                         "run, headless")
    run_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--max-buffer-s", type=number, default=2.0,
                       help="audio a client may send ahead of real time (seconds)")
    serve.add_argument("--max-message-kb", type=int, default=256,
                       help="largest client message (KiB); larger ones close the connection")
    serve.add_argument("--max-queued-events", type=int, default=512,
                       help="events waiting for a client that does not read; more close its "
                            "connection (slow_reader, 1008)")
    serve.add_argument("--send-buffer-kb", type=int, default=None,
                       help="kernel send buffer per connection (KiB; default: the kernel's "
                            "choice, up to 4 MiB)")

    load = sub.add_parser("load", help="drive N paced sessions against a realtime WebSocket "
                                       "server and record them as a run")
    load.add_argument("--url", required=True, help="e.g. ws://127.0.0.1:8765/v1/realtime")
    load.add_argument("--sessions", type=int, default=8)
    load.add_argument("--duration", type=number, default=10.0, help="seconds of audio sent")
    load.add_argument("--load", choices=["fixed", "ramp", "poisson"], default="fixed")
    load.add_argument("--arrival-rate", type=number, default=None)
    load.add_argument("--wav-dir", default=None, help="folder of .wav files (default: "
                                                      "synthetic speech)")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--protocol", choices=PROTOCOLS,
                      default="auto", help="the server's realtime dialect (default auto: told "
                                           "from its first events; docs/GATEWAY.md)")
    load.add_argument("--model", default=None,
                      help="the served model's name (vLLM's session.update needs it)")
    load.add_argument("--frame-ms", type=number, default=80.0,
                      help="used only when the server does not say (session.created)")
    load.add_argument("--sample-rate", type=int, default=None,
                      help="input rate in Hz when the server does not say (default: 24000 "
                           "OpenAI, 16000 vLLM)")
    load.add_argument("--budget-ms", type=number, default=None,
                      help="a frame's deadline after its send when the server does not say "
                           "(default: the frame period)")
    load.add_argument("--token", default=os.environ.get("METRONOME_TOKEN"),
                      help="a server bound beyond loopback asks for its token (default: "
                           "$METRONOME_TOKEN); sent as `Authorization: Bearer`")
    load.add_argument("--db", default=None)
    load.add_argument("--no-store", action="store_true", help="do not record the run")
    load.add_argument("--json", action="store_true")


def cmd_serve(args) -> int:
    from cli.run_commands import EXIT_FAILED, _human, run_config_from_args, stdout_for_json
    from gateway.protocol import GatewayLimits
    from gateway.serve import serve
    from runtime.remote import InletLimits

    args.load = "gateway"
    if args.duration is None:
        args.duration = SERVE_DURATION_S
    config = run_config_from_args(args)
    limits = GatewayLimits(max_message_bytes=args.max_message_kb * 1024,
                           max_queued_events=args.max_queued_events,
                           send_buffer_bytes=None if args.send_buffer_kb is None
                           else args.send_buffer_kb * 1024)
    inlet_limits = InletLimits(max_buffer_s=args.max_buffer_s)
    out = stdout_for_json()
    summary = serve(config, host=args.host, port=args.port, db=args.db, limits=limits,
                    inlet_limits=inlet_limits)
    out.write((json.dumps(summary, default=str) if args.json else _human(summary)) + "\n")
    out.flush()
    return 0 if summary["status"] in ("finished", "aborted") else EXIT_FAILED


def cmd_load(args) -> int:
    from gateway.client import LoadClientConfig, run_load
    from store import open_store

    cfg = LoadClientConfig(url=args.url, sessions=args.sessions, duration_s=args.duration,
                           load=args.load, arrival_rate=args.arrival_rate, wav_dir=args.wav_dir,
                           seed=args.seed, protocol=args.protocol, model=args.model,
                           frame_ms=args.frame_ms, sample_rate_hz=args.sample_rate,
                           budget_ms=args.budget_ms, token=args.token)
    store = None if args.no_store else open_store(args.db)
    try:
        summary = run_load(cfg, store)
    finally:
        if store is not None:
            store.close()
    print(json.dumps(summary) if args.json
          else "\n".join(f"{k:>20}: {v}" for k, v in summary.items()))
    return 0
