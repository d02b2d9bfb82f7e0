"""engine/handover.py on a real asyncio loop in its own thread, as the vLLM backend runs it."""

import asyncio
import threading

from engine.handover import Handover


def _loop_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def test_held_puts_reach_the_loop_in_one_callback_and_unheld_ones_each_alone():
    loop, thread = _loop_thread()
    try:
        handover = Handover(loop)
        queues = [asyncio.Queue() for _ in range(3)]
        callbacks = []
        real = loop.call_soon_threadsafe

        def counting(callback, *args):
            callbacks.append(callback)
            return real(callback, *args)

        loop.call_soon_threadsafe = counting
        with handover.held():
            for k, q in enumerate(queues):
                handover.put(q, k)
            with handover.held():  # nested: still the outer block's
                handover.put(queues[0], 9)
            assert callbacks == []  # nothing handed over inside the block
        assert len(callbacks) == 1
        handover.put(queues[1], 7)
        handover.put(queues[2], 8)
        assert len(callbacks) == 3
        done = threading.Event()
        real(done.set)
        assert done.wait(5)
        got = [[q.get_nowait() for _ in range(q.qsize())] for q in queues]
        assert got == [[0, 9], [1, 7], [2, 8]]  # every item, in order
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_another_thread_s_puts_are_not_held_by_this_one_s_block():
    loop, thread = _loop_thread()
    try:
        handover = Handover(loop)
        q = asyncio.Queue()
        with handover.held():
            other = threading.Thread(target=handover.put, args=(q, "other"))
            other.start()
            other.join(5)
            done = threading.Event()
            loop.call_soon_threadsafe(done.set)
            assert done.wait(5)
            assert q.qsize() == 1  # the other thread's item went at once
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
