"""vLLM's own data-parallel balancer, as the twin reproduces it (vllm 0.32,
`DPLBAsyncMPClient.get_core_engine_for_request`).

A streaming session is one request for its whole life, so it stays "in flight" on its engine:
the score counts sessions, not how fast each engine's pool is filling. Waiting requests add a
KV-pressure penalty only once usage is past 0.5, i.e. once an engine already queues for blocks.
Ties rotate: the scan starts one engine further at every placement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLoad:
    """What vLLM's client knows of one engine when it places a request."""

    inflight: int  # requests this client placed there and not finished (sessions)
    waiting: int
    running: int
    kv_usage: float  # 0..1

    def score(self) -> float:
        score = float(max(self.inflight, self.waiting + self.running))
        if self.waiting:
            # vLLM: "ramps from 0 at <=50% usage to 3x waiting at 100%"
            score += self.waiting * 6.0 * max(0.0, self.kv_usage - 0.5)
        return score


def vllm_pick(loads: list[EngineLoad], start: int) -> int:
    """The engine vLLM's balancer picks: lowest score, scanning from `start` (ties: first)."""
    if not loads:
        raise ValueError("no engines to place a request on; allowed: ≥ 1")
    n = len(loads)
    best, best_score = start % n, float("inf")
    for i in range(n):
        idx = (start + i) % n
        score = loads[idx].score()
        if score < best_score:
            best, best_score = idx, score
    return best
