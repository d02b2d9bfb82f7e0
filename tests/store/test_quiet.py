"""A timed flush waits for the runs' frames in flight to be done (runtime/in_flight.py), and no
longer than its budget."""

from __future__ import annotations

import threading
import time

import pytest

from engine.contract import FrameHandle
from runtime.in_flight import InFlight
from store.queries import frame_counts
from store.quiet import QuietWaits
from store.writer import StoreWriter
from tests.store.test_losses import _frame


def _on_disk(store, run_id: str) -> int:
    return frame_counts(store.cursor(), run_id)["frames"]


def _writer(store, budget_s: float) -> StoreWriter:
    """The store's connection with a writer that flushes every 50 ms (the store's own writer
    is closed first: one writer per connection)."""
    assert store.writer.close()
    store.writer = StoreWriter(store.cursor(), flush_interval_s=0.05)
    store.writer.quiet = QuietWaits(budget_s)
    return store.writer


def test_a_timed_flush_waits_for_the_frame_in_flight(store):
    writer = _writer(store, budget_s=5.0)
    in_flight = InFlight()
    frame = FrameHandle(session_id=0, t_submit=time.monotonic(), max_new=4)
    in_flight.add(frame)
    writer.quiet.add(in_flight.wait_idle)
    writer.add_many("frames", [_frame("q", i) for i in range(3)])
    time.sleep(0.6)  # a dozen flush intervals: each would have written the rows
    assert _on_disk(store, "q") == 0  # the writer holds them while the frame is in flight
    frame.finish(time.monotonic())
    deadline = time.monotonic() + 10  # a loaded CI core: the writer runs when it is scheduled
    while _on_disk(store, "q") < 3:
        assert time.monotonic() < deadline, "the rows were not written once the frame was done"
        time.sleep(0.05)
    writer.quiet.remove(in_flight.wait_idle)


def test_the_wait_is_bounded_by_its_budget(store):
    writer = _writer(store, budget_s=0.3)
    in_flight = InFlight()
    in_flight.add(FrameHandle(session_id=0, t_submit=time.monotonic(), max_new=4))  # never done
    writer.quiet.add(in_flight.wait_idle)
    writer.add_many("frames", [_frame("b", i) for i in range(3)])
    deadline = time.monotonic() + 10
    while _on_disk(store, "b") < 3:  # written once the budget ran out
        assert time.monotonic() < deadline, "a never-idle engine kept the rows off the disk"
        time.sleep(0.05)
    writer.quiet.remove(in_flight.wait_idle)


def test_in_flight_waits_for_every_pending_frame():
    in_flight = InFlight()
    assert in_flight.wait_idle(0.0)  # nothing submitted: idle
    frames = [FrameHandle(session_id=i, t_submit=0.0, max_new=1) for i in range(3)]
    for frame in frames:
        in_flight.add(frame)
    frames[0].finish(1.0)
    assert not in_flight.wait_idle(0.05)  # two still pending
    timer = threading.Timer(0.1, lambda: [f.finish(2.0) for f in frames[1:]])
    timer.start()
    assert in_flight.wait_idle(10.0)
    timer.join()
    assert in_flight.pending() == []


def test_quiet_waits_refuses_a_bad_budget():
    with pytest.raises(ValueError, match="budget_s=-1"):
        QuietWaits(-1)
