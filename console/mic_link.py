"""The Load page's links to the operator's microphone page: the console's own (`MIC_PAGE`, on
the console's origin: console/routes.py serves it), and that of a headless `metronome
serve` elsewhere, from its address."""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

MIC_PAGE = "/mic"  # the console's own, relative: the browser keeps the console's origin
GATEWAY_URL_ENV = "METRONOME_GATEWAY_URL"  # where the console's operators find `metronome serve`
DEFAULT_GATEWAY = "http://127.0.0.1:8765"  # `metronome serve`'s default host and port
# The serve line prints ws://…; a browser opens the page over http of the same host and port.
_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}


def default_gateway() -> str:
    return os.environ.get(GATEWAY_URL_ENV, "").strip() or DEFAULT_GATEWAY


def mic_page_url(address: str) -> str:
    """The microphone page of the gateway at `address`: what serve printed
    (ws://host:port/v1/realtime), an http(s) URL, or host:port. ValueError says what is wrong."""
    text = address.strip()
    if not text:
        raise ValueError("give the address of a running `metronome serve`, e.g. "
                         f"{DEFAULT_GATEWAY}")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"{parts.scheme}:// is not a gateway address: use http(s):// or "
                         "ws(s)://")
    try:
        port = parts.port  # raises on a port that is not a number or out of range
    except ValueError:
        raise ValueError(f"{address.strip()!r:.80} has no valid port") from None
    if not parts.hostname:
        raise ValueError(f"{address.strip()!r:.80} names no host")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{scheme}://{host}{'' if port is None else f':{port}'}/mic"
