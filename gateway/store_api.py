"""The holder's read endpoint (store/shared_reads.py): `POST /api/store/sql` {sql, params} →
the rows of one SELECT on the holder's own connection, as an Arrow IPC stream; behind the same
door as everything the server serves. The query runs in a worker thread, never on the event
loop that carries the sessions' frames."""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from store.shared_reads import run_select

logger = logging.getLogger(__name__)

PATH = "/api/store/sql"
MAX_BODY_BYTES = 256 * 1024


def store_route(get_store) -> Route:
    """`get_store()`: the Store this process holds (opened on demand by the console)."""

    async def handler(request):
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return PlainTextResponse(f"a query of {len(body)} bytes is above the "
                                     f"{MAX_BODY_BYTES} allowed", status_code=413)
        try:
            query = json.loads(body)
            sql, params = query["sql"], query.get("params") or []
            if not isinstance(params, list):
                raise ValueError("params must be a list")
            data = await asyncio.to_thread(_select, get_store, sql, params)
        except (ValueError, KeyError, TypeError) as exc:
            return PlainTextResponse(f"bad query: {exc}", status_code=400)
        except Exception as exc:  # noqa: BLE001 - DuckDB's errors: the reader reads why
            return PlainTextResponse(f"the query failed: {str(exc).splitlines()[0]}",
                                     status_code=400)
        return Response(data, media_type="application/vnd.apache.arrow.stream")

    return Route(PATH, handler, methods=["POST"])


def _select(get_store, sql: str, params: list) -> bytes:
    return run_select(get_store().cursor(), sql, params)
