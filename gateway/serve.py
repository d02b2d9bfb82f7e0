"""`metronome serve`: one run whose sessions are the gateway's clients, served headless under
uvicorn on the main thread while the run loop has its own.

The run starts once the socket listens (so its clock does not tick for nobody) and the server
stops when the run ends: at its duration, or when SIGINT/SIGTERM stops it (status `aborted`,
reason "interrupted by signal SIGTERM"); either way the summary is the run's, as `metronome run`
prints it, and the exit code is 0. A second signal kills the process the default way. The twin
is always paced here: clients live in wall-clock time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
import threading

import uvicorn

from gateway.door import Door, local_address
from gateway.link import LinkServer, start_workers, stop_workers
from gateway.protocol import GatewayLimits
from gateway.server import Gateway, Target
from gateway.store_api import PATH as STORE_API, store_route
from runtime import Runner, make_engine
from runtime.config import RunConfig
from runtime.remote import Inlet, InletLimits
from store import open_store
from store.shared_reads import publish, withdraw

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# After the run ends, connections get this long to close before uvicorn drops them: a client
# that stopped reading cannot take the close frame and would hold the shutdown forever.
GRACEFUL_SHUTDOWN_S = 3.0


def session_info(runner: Runner, inlet: Inlet) -> dict:
    """What every session of the run shares in `session.created` (the run's settings); the
    connection adds its id and the client's settings (gateway/protocol.session_object)."""
    cfg = runner.config
    return {"model": cfg.model, "run_id": runner.run_id,
            "metronome": {"run_id": runner.run_id, "engine": cfg.engine,
                          "model_rate_hz": inlet.limits.sample_rate_hz,
                          "frame_ms": cfg.frame_ms,
                          "frame_samples": inlet.tokenizer.frame_samples,
                          "tokens_in": cfg.tokens_in, "tokens_out": cfg.tokens_out,
                          "budget_ms": cfg.budget, "max_buffer_s": inlet.limits.max_buffer_s}}


def text_codec(engine):
    """The model's tokenizer for the gateway's words, or None (logged) where it has none."""
    from engine.text import TextCodec

    try:
        path = engine.tokenizer_dir
        return None if path is None else TextCodec(path, engine.vocab_size)
    except (ValueError, OSError) as exc:
        logger.warning("the gateway sends token counts without words: %s", exc)
        return None


def serve(config: RunConfig, *, host: str, port: int, db: str | None,
          limits: GatewayLimits = GatewayLimits(), inlet_limits: InletLimits = InletLimits(),
          ready=None, workers: int = 0) -> dict:
    """Serve `config`'s run on ws://host:port/v1/realtime until it ends; returns its summary.
    `ready(url)` is called once the socket listens (the CLI prints it to stderr). `workers`
    > 0: that many gateway worker processes take the port's connections (gateway/link.py);
    this process keeps the run, and its own routes (the store's read API) move to a private
    loopback port."""
    if not 0 <= workers <= 64:
        raise ValueError(f"gateway workers {workers} must be in [0, 64]")
    if config.load != "gateway":
        raise ValueError(f"serve runs load gateway (its sessions are clients), not {config.load}")
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} must be in [1, 65535]")
    if config.engine == "twin" and not config.paced:
        config = dataclasses.replace(config, paced=True)
    store = open_store(db)
    engine = None
    try:
        engine = make_engine(config, store)
        inlet = Inlet(config, engine.vocab_size, inlet_limits)
        runner = Runner(config, engine, store, inlet=inlet)
        info = session_info(runner, inlet)
        target = Target(inlet, info, text_codec(engine))
        gateway = Gateway(lambda: target if runner.running else None, limits)
        door = Door.for_host(host)
        link = None if not workers else LinkServer(inlet, {
            "info": info, "max_buffer_s": inlet_limits.max_buffer_s, "limits": limits,
            "tokenizer": (inlet_limits.sample_rate_hz, config.frame_ms, config.tokens_in,
                          engine.vocab_size),
            "codec": None if target.codec is None else (engine.tokenizer_dir, engine.vocab_size),
            "audio": engine.frame_token_ids is not None, "token": door.token,
            "graceful_s": GRACEFUL_SHUTDOWN_S})
        own_host, own_port = (host, port) if link is None else ("127.0.0.1", 0)
        server = uvicorn.Server(uvicorn.Config(
            gateway.app(door, (store_route(lambda: store),)), host=own_host, port=own_port,
            log_level="warning", lifespan="off",
            # Frames above this are refused by the protocol layer before they are read; up to
            # it, the gateway answers an oversized message with an error event.
            ws_max_size=4 * limits.max_message_bytes,
            # No permessage-deflate: base64 PCM and short JSON deltas barely compress, and
            # zlib was the event loop's largest leaf in a py-spy profile (issue 34).
            ws_per_message_deflate=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
        sockets = _sockets(server.config, limits, link is not None)
        own = f"{local_address(host)}:{port}" if link is None \
            else f"127.0.0.1:{sockets[0].getsockname()[1]}"
        if store.path != ":memory:":  # readers of the file while serve holds it
            publish(store.path, f"http://{own}{STORE_API}", door.token)
        with _stop_on_signals(runner) as handler:
            asyncio.run(_serve(server, sockets, runner, f"ws://{host}:{port}/v1/realtime",
                               ready or (lambda url: _announce(url, door)), handler,
                               (link, workers, host, port)))
        if runner.summary is None:  # the server stopped first (a signal): end the run
            runner.stop("server stopped")
            runner.join()
        return runner.summary
    finally:
        withdraw(store.path)
        if engine is not None:
            engine.shutdown()
        store.close()


def _sockets(config: uvicorn.Config, limits: GatewayLimits,
             private: bool = False) -> list[socket.socket] | None:
    """The listening socket, bound here when its send buffer is set (accepted connections
    inherit SO_SNDBUF from it on Linux) or on a private port (workers hold the public one).
    None: uvicorn binds its own."""
    if private:
        return [config.bind_socket()]
    if limits.send_buffer_bytes is None:
        return None
    sock = config.bind_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.send_buffer_bytes)
    return [sock]


@contextlib.contextmanager
def _stop_on_signals(runner: Runner):
    """SIGINT/SIGTERM stop the run, not the server: the run ends as at its duration (clients
    told, summary written) and the server follows it. uvicorn's own handlers would stop the
    server first and re-raise the signal once it is down, killing the process before the
    summary; so ours sit below uvicorn's (its re-raise lands here) and replace them once the
    socket listens (`_serve`). Signals are the main thread's only: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    seen: list[int] = []

    def handler(sig: int, _frame) -> None:
        if seen:  # a second signal: the operator insists, the default way
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)
            return
        seen.append(sig)
        logger.warning("signal %s: ending the run", signal.Signals(sig).name)
        runner.stop(f"interrupted by signal {signal.Signals(sig).name}")

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield handler
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


async def _serve(server: uvicorn.Server, sockets, runner: Runner, url: str, ready,
                 handler, front) -> None:
    task = asyncio.create_task(server.serve(sockets))
    while not server.started:
        if task.done():  # failed to bind: its exception says why
            task.result()
            raise RuntimeError(f"the server did not start on {url}")
        await asyncio.sleep(0.02)
    link, workers, host, port = front
    procs = [] if link is None else await start_workers(link, workers, host, port)
    if handler is not None:  # uvicorn has installed its handlers by now: ours go on top
        for sig in SIGNALS:
            signal.signal(sig, handler)
    runner.start()
    while runner.status == "created":  # running before we tell anyone it is there
        await asyncio.sleep(0.005)
    ready(url)
    try:
        while runner.summary is None and not task.done():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # let the last events and closes reach the clients
    finally:
        if link is not None:
            await stop_workers(link, procs, GRACEFUL_SHUTDOWN_S + 2)
    server.should_exit = True
    await task


def _announce(url: str, door: Door) -> None:
    page = door.url(url.replace("ws://", "http://", 1).removesuffix("/v1/realtime") + "/mic")
    print(f"metronome serve: listening on {url}\n"
          f"metronome serve: microphone page {page} (a browser offers the microphone on "
          "localhost or https only)", file=sys.stderr, flush=True)
    if door.token is not None:
        print("metronome serve: bound beyond loopback: clients send the token as "
              f"`Authorization: Bearer {door.token}` (the OpenAI SDK's api_key)",
              file=sys.stderr, flush=True)
