"""The operator's microphone page, served by the gateway's own process next to /v1/realtime.

`GET /mic` is a page that streams the browser's microphone into `/v1/realtime` as one session
(getUserMedia + an AudioWorklet that downsamples to 16 kHz PCM16) and shows the frames the
server records for it as they come back (`response.done`: latency, silent). The page is plain
static files in gateway/static/, hand-written, no build step: they are read per request so an
edited page shows on reload, and only the names listed here are served (no path from the URL
reaches the file system).
"""

from __future__ import annotations

import logging
from pathlib import Path

from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

logger = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
# URL name → (file, media type). The worklet must be its own script: AudioWorklet.addModule
# loads it by URL into the audio thread.
ASSETS = {"mic.js": ("mic.js", "text/javascript"),
          "mic-worklet.js": ("mic-worklet.js", "text/javascript")}
# A mic page has no reason to be embedded or to load anything from elsewhere.
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'self'; connect-src 'self' ws: wss:; "
                                      "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"}


def routes() -> list:
    return [Route("/mic", _page), Route("/mic/{name}", _asset)]


def _read(name: str, media_type: str) -> Response:
    try:
        body = (STATIC / name).read_text(encoding="utf-8")
    except OSError as exc:  # an install without the static files: say so, not a bare 500
        logger.error("mic page file %s unreadable: %s", name, exc)
        return PlainTextResponse(f"the microphone page is not installed ({name}: {exc})", 500)
    return Response(body, media_type=media_type, headers=HEADERS)


async def _page(_request) -> Response:
    return _read("mic.html", "text/html")


async def _asset(request) -> Response:
    asset = ASSETS.get(request.path_params["name"])
    if asset is None:
        return PlainTextResponse("not found", 404)
    return _read(*asset)
