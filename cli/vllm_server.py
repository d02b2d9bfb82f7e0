"""`python -m cli.vllm_server asr-tiny --port 8000 [any vllm serve option ...]`: vLLM's own
OpenAI-compatible server (its /v1/realtime included) for a model, in this process
(engine/vllm_server.py says why not the `vllm` script). This module is only the command line:
it must stay the main module, since vLLM's spawned engine process imports it again, and
importing it imports engine.vllm_server, which installs what the model needs on import."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from engine.vllm_server import Refusal, prepare, serve

EXIT_REFUSED = 2


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m cli.vllm_server",
        description="vLLM's own OpenAI-compatible server (with /v1/realtime) for a model; "
                    "other options go to `vllm serve`")
    parser.add_argument("model", help="asr-tiny (built on first use) or a model folder")
    parser.add_argument("--seed", type=int, default=0, help="the named model's seed")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None,
                        help="the name clients ask for (default: the model argument)")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("METRONOME_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    try:
        vllm_argv = prepare(args.model, args.seed, args.host, args.port,
                            args.served_model_name, extra)
    except Refusal as exc:
        print(f"vllm_server: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    serve(vllm_argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
