"""Frames handed to the engine's event loop from another thread, one wake-up per instant.

A fixed load's sessions are due at the same instant. Handed over one `call_soon_threadsafe`
each, the loop thread wakes on the first and ships it to the engine core before the run thread
(holding the GIL for the next frame's Python) has handed the rest: the idle core starts a step
with one or two of them and the rest wait for the next step, so every period takes one more step
than raw vLLM's (benchmarks/frame_floor.py prints steps per period and requests per step;
docs/benchmarks/frame_floor.md has the figures). Held while the run thread submits one
instant's frames, they reach the loop in one call, as raw vLLM's requests do when their timers
fire together.

    with handover.held():          # the run thread, around one instant's submits
        handover.put(queue, item)  # queued; one call_soon_threadsafe when the block ends
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class Handover:
    """`put(queue, item)`: `queue.put_nowait(item)` on `loop`'s thread, now or, inside `held()`
    on the calling thread, with the block's other puts in one callback at its end."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._local = threading.local()  # per thread: another thread's puts are never held

    def put(self, queue: asyncio.Queue, item) -> None:
        pending = getattr(self._local, "pending", None)
        if pending is None:
            self._loop.call_soon_threadsafe(queue.put_nowait, item)
        else:
            pending.append((queue, item))

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if getattr(self._local, "pending", None) is not None:
            yield  # nested: the outer block hands them over
            return
        self._local.pending = []
        try:
            yield
        finally:
            pending, self._local.pending = self._local.pending, None
            if pending:
                self._loop.call_soon_threadsafe(_put_all, pending)


def _put_all(pending: list) -> None:
    for queue, item in pending:
        queue.put_nowait(item)
