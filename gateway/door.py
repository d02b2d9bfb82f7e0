"""A token at the door: who may reach a server bound beyond loopback.

Loopback stays open, as Streamlit and Prometheus are by default: whoever reaches 127.0.0.1 is
on the machine (or came through an SSH tunnel, which asked already). Bound to anything else
(0.0.0.0, a LAN address, 127.0.0.2 — only 127.0.0.1, ::1 and localhost count as loopback, so
a test can bind 127.0.0.2 as a stand-in for a remote interface), every request needs the token:

    Authorization: Bearer TOKEN   how the OpenAI SDK sends its api_key, and Prometheus too
    ?token=TOKEN                  once, from the URL the server printed: a page answers with
                                  a redirect that sets the cookie and drops it from the URL
    cookie metronome_token        what a browser sends afterwards (the console's own
                                  WebSocket, through which every control action goes, too)

Without it: 401 and one line in the log; nothing reaches the app. The token is
$METRONOME_TOKEN, or one generated at start and printed with the address.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

logger = logging.getLogger(__name__)

TOKEN_ENV = "METRONOME_TOKEN"
COOKIE = "metronome_token"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
OPEN_PATHS = ("/healthz",)  # says which run serves and how many connect: no data, no control


@dataclass(frozen=True)
class Door:
    """`token` None: open (loopback)."""

    token: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise ValueError(f"a token of {len(self.token)} characters is too short: give "
                             f"${TOKEN_ENV} at least 16")

    @classmethod
    def for_host(cls, host: str) -> Door:
        """Open on loopback; elsewhere $METRONOME_TOKEN or a new token."""
        if host.strip("[]") in LOOPBACK:
            return cls(None)
        return cls(os.environ.get(TOKEN_ENV, "").strip() or secrets.token_urlsafe(24))

    def admits(self, given: str | None) -> bool:
        if self.token is None:
            return True
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def url(self, base: str) -> str:
        """`base` as an operator opens it: with the token where one is needed."""
        return base if self.token is None else f"{base}?{urlencode({'token': self.token})}"


def local_address(host: str) -> str:
    """How a process on this machine reaches a server bound to `host` (all interfaces: via
    loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


class TokenMiddleware:
    """ASGI middleware: every HTTP request and WebSocket through `door` (Starlette's
    `Middleware(TokenMiddleware, door=...)`, the console's st.App and `metronome serve`)."""

    def __init__(self, app, door: Door) -> None:
        self.app = app
        self.door = door

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self.door.token is None \
                or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        bearer = headers.get("authorization", "")
        given = [bearer[7:].strip() if bearer.lower().startswith("bearer ") else None,
                 _cookie(headers.get("cookie", ""), COOKIE), query.get("token")]
        if any(self.door.admits(g) for g in given if g):
            if scope["type"] == "http" and self.door.admits(query.get("token")):
                await _set_cookie(scope, send, query, self.door.token)  # then a clean URL
                return
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("?", 0)
        logger.warning("refused %s %s from %s: %s", scope["type"], scope["path"], client[0],
                       "wrong token" if any(given) else "no token")
        await _refuse(scope, receive, send)


def _cookie(header: str, name: str) -> str | None:
    """One cookie's value from a Cookie header, parsed by hand: http.cookies stops at the first
    value it finds illegal, and a browser sends every cookie of the origin (Streamlit's too)."""
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value.strip().strip('"')
    return None


async def _set_cookie(scope, send, query: dict, token: str) -> None:
    rest = urlencode({k: v for k, v in query.items() if k != "token"})
    location = scope["path"] + (f"?{rest}" if rest else "")
    await send({"type": "http.response.start", "status": 303, "headers": [
        (b"location", location.encode("latin-1")),
        (b"set-cookie", f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict".encode())]})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(scope, receive, send) -> None:
    body = b"401: this server asks for its token (Authorization: Bearer, or the printed URL)\n"
    start = {"status": 401, "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"www-authenticate", b"Bearer")]}
    if scope["type"] == "http":
        await send({"type": "http.response.start", **start})
        await send({"type": "http.response.body", "body": body})
        return
    await receive()  # the handshake's websocket.connect comes first
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", **start})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # a server without the denial response: refused all the same (403)
        await send({"type": "websocket.close", "code": 1008})
