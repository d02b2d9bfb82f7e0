"""What the console's own server serves beside its pages, on the same port (`streamlit run
streamlit_app.py` runs st.App with these): the gateway's `/v1/realtime`, the microphone page
`/mic`, `/healthz` and Prometheus' `/metrics`, all behind the door (gateway/door.py: open on
loopback, a token beyond it).

A client joins the run the console is running, admitted by its gate, its frames on the same
Live page (origin `gateway`); when nothing runs (or a run in simulated time, which no wall-clock
client can join) it is told so in an `error` and should start one from the Load page: a run
takes remote clients for as long as it runs, with any load, and the Load page's shape
`gateway` is a run of remote clients only. Nothing here imports Streamlit.
"""

from __future__ import annotations

import contextlib
import logging

from starlette.middleware import Middleware
from starlette.routing import Route

from services.run_host import current_host
from metrics.server import metrics_route
from gateway.door import Door, TokenMiddleware, local_address
from gateway.server import Gateway
from gateway.store_api import PATH as STORE_API, store_route
from store import db_path, open_store
from store.shared_reads import publish, withdraw

logger = logging.getLogger(__name__)

NO_RUN = ("no run is serving sessions now: start one on the console's Load page (on vLLM, or "
          "the twin paced to the wall clock)")


def _target():
    host = current_host()
    return None if host is None else host.gateway_target()


def console_routes() -> list:
    return [*Gateway(_target, no_run=NO_RUN).routes(), Route("/metrics", metrics_route),
            store_route(lambda: open_store(db_path()))]


@contextlib.asynccontextmanager
async def lifespan(_app):
    """The console's server: at its end, readers are no longer sent to it."""
    yield None
    withdraw(db_path())


def publish_reads(door: Door, address: str, port: int) -> None:
    """Readers of the console's database (`metronome runs --db …`) find it here while it
    holds the file (store/shared_reads.py); a stale file names a pid that is gone."""
    if db_path() == ":memory:":
        return
    publish(db_path(), f"http://{local_address(address)}:{port}{STORE_API}", door.token)


def console_middleware(door: Door) -> list:
    return [Middleware(TokenMiddleware, door=door)]


def announce(door: Door, address: str, port: int) -> None:
    """What the operator needs to reach the console from elsewhere (stderr, at start)."""
    if door.token is None:
        return
    base = f"http://{address}:{port}/"
    logger.warning("the console is bound beyond loopback (%s): open %s once (it sets a "
                   "cookie); realtime clients send `Authorization: Bearer %s`", address,
                   door.url(base), door.token)
