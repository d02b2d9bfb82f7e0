"""The process's metrics endpoint: one exporter on prometheus_client's default registry, served
over HTTP. The default registry is where vLLM's PrometheusStatLogger (which AsyncLLM always adds
next to our own stat logger) registers its `vllm:*` metrics in this same process, so one scrape
carries both, unrenamed."""

from __future__ import annotations

import logging
import os
import threading

from prometheus_client import REGISTRY, start_http_server

from metrics.exporter import MetricsExporter

logger = logging.getLogger(__name__)

DEFAULT_PORT = 9464  # the port the console serves on unless METRONOME_METRICS_PORT says else
METRICS_PORT_ENV = "METRONOME_METRICS_PORT"  # 0 turns the console's own metrics port off
METRICS_ADDR_ENV = "METRONOME_METRICS_ADDR"

_lock = threading.Lock()
_exporter: MetricsExporter | None = None
_servers: dict[tuple[str, int], object] = {}  # (addr, bound port) → WSGI server


def default_exporter() -> MetricsExporter:
    """The process-wide exporter, registered once on the default registry."""
    global _exporter
    with _lock:
        if _exporter is None:
            exporter = MetricsExporter()
            REGISTRY.register(exporter)
            _exporter = exporter
        return _exporter


def check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"metrics port {port!r} must be an integer in [0, 65535] (0: any free)")
    return port


def serve(port: int, addr: str = "127.0.0.1") -> int:
    """Serve the default registry on addr:port (0: any free port); returns the bound port.
    Idempotent: a second call for the same addr and port returns at once. Raises ValueError
    naming the address when it cannot be bound (in use, not local)."""
    check_port(port)
    default_exporter()
    with _lock:
        if port and (addr, port) in _servers:
            return port
        try:
            server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
        except OSError as exc:
            raise ValueError(f"metrics address {addr}:{port} cannot be served: "
                             f"{exc.strerror or exc}") from None
        bound = server.server_address[1]
        _servers[(addr, bound)] = server
    logger.info("Prometheus metrics on http://%s:%d/metrics", addr, bound)
    return bound


def stop_serving(port: int, addr: str = "127.0.0.1") -> None:
    """Close the endpoint on addr:port; a no-op when none is served there."""
    with _lock:
        server = _servers.pop((addr, port), None)
    if server is not None:
        server.shutdown()
        server.server_close()


def metrics_port_from_env() -> int:
    text = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not text:
        return DEFAULT_PORT
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ValueError(f"{METRICS_PORT_ENV}={text!r} must be a port in [1, 65535], or 0 (off)")
    return port


def serve_from_env(port: int | None) -> tuple[MetricsExporter | None, str | None]:
    """The console's metrics port (None: $METRONOME_METRICS_PORT, default 9464; 0: off):
    (the exporter, the URL served) or (None, why none is); never raises."""
    addr = os.environ.get(METRICS_ADDR_ENV, "127.0.0.1")
    try:
        port = metrics_port_from_env() if port is None else port
        if port == 0:
            return None, None
        bound = serve(port, addr)
    except ValueError as exc:
        logger.error("no Prometheus metrics: %s", exc)
        return None, f"off: {exc}"
    return default_exporter(), f"http://{addr}:{bound}/metrics"


async def metrics_route(_request):
    """/metrics on an ASGI server (the console's own port): the same registry."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.responses import Response

    default_exporter()
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
