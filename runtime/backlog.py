"""Whether a session's frame may be submitted while the engine still owes it the previous one.

A session's source advances every period whether or not the engine keeps up (speech does not
wait). A frame that finds the previous one owed but one step from done (only its last token to
come) is queued behind it: the engine starts it a few milliseconds late rather than lose a whole
frame to a few milliseconds of overrun (seen on vLLM: ten sessions opened together finished
their first frame 3 ms late, and every one's second frame was skipped, silent).

A frame that finds the previous one further from done is queued too when, at the previous
frame's own pace (the gap between its first and its latest token), the previous frame's tokens
left plus its own fit in its budget. At the edge of the engine's capacity raw vLLM queues every
chunk, and a next frame starting a step or two late still keeps its budget; a skip would make it
silent. A misjudged frame is late, not lost: it is still answered.

Any other frame that finds the previous one owed is skipped (so is one with no pace yet: fewer
than two tokens at distinct times): queued behind a frame far from done, or behind two, it would
be late too, and an overloaded engine would make every frame late, not every other one (the
twin at 14 ms a step, 5 sessions, a 60 ms budget: skipping alone left 20 % of frames silent,
queueing behind any owed frame 78 %, the one-step rule alone 12 %).
"""

from __future__ import annotations

from engine.contract import FrameHandle


def may_submit(previous: FrameHandle | None, ahead: FrameHandle | None, now: float,
               max_new: int, budget_s: float) -> bool:
    """True: submit now (the engine queues it behind `previous` if that is still owed).
    `ahead`: the frame `previous` was itself queued behind (None if it was not); `max_new` and
    `budget_s`: this frame's tokens and deadline, for the pace rule."""
    if not owed(previous, now):
        return True
    if owed(ahead, now):
        return False  # never behind two
    left = previous.max_new - previous.tokens_by(now)
    if left <= 1:
        return True
    step_s = pace_s(previous, now)
    return step_s is not None and (left + max_new) * step_s <= budget_s


def pace_s(handle: FrameHandle, now: float) -> float | None:
    """Seconds a token of `handle` so far, first token to latest (decode steps); None when it
    has fewer than two tokens at distinct times by `now`."""
    times = [t for t in list(handle.token_times) if t <= now]
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


def count_new(handle: FrameHandle | None, seen: int) -> tuple[int, int]:
    """(tokens of `handle` a tick has not counted yet, tokens counted with them)."""
    if handle is None:
        return 0, 0
    n = len(handle.token_times)
    return n - seen, n


def owed(handle: FrameHandle | None, now: float) -> bool:
    """The engine still owes this frame at `now`."""
    return handle is not None and not handle.done_by(now)
