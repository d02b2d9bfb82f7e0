"""Session placement across data-parallel ranks: which rank's KV pool a new session joins.

A streaming session lives on one rank for its whole life, and each rank has its own pool, so
the question is not "which rank is least busy" but "which pool fills last if it takes one more
session". Placements:
  engine    the engine decides (vLLM's own balancer: requests in flight, a KV penalty only
            once requests already queue); the runtime does not pin
  count     fewest live sessions, ties in rotation: what vLLM's balancer does for streaming
            sessions, pinned by Metronome so the choice is on the record
  headroom  the rank whose predicted time to saturation with one more session is longest
            (bounded KV: the lowest predicted plateau); ties by occupancy, then rotation
Pure: the caller passes each rank's state; `Placer` keeps only the rotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PLACEMENTS = ("engine", "count", "headroom")


@dataclass(frozen=True)
class RankLoad:
    """One rank as placement sees it."""

    rank: int
    occupancy: float  # ρ now, in [0, 1]
    live: int  # sessions living on it
    slope_per_s: float | None = None  # fitted dρ/dt over the last seconds; None: no fit yet

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank {self.rank} must be ≥ 0")
        if not 0 <= self.occupancy <= 1:
            raise ValueError(f"rank {self.rank} occupancy {self.occupancy} must be in [0, 1]")
        if self.live < 0:
            raise ValueError(f"rank {self.rank} live sessions {self.live} must be ≥ 0")


def t_sat_with_one_more_s(load: RankLoad, growth_per_session_per_s: float,
                          plateau_per_session: float | None) -> float:
    """Seconds until the rank's pool fills if it takes one more session; inf when it settles
    below full (bounded KV) or does not grow.

    Unbounded KV grows by each live session's token rate; the fitted slope counts when it is
    steeper (prefills, rollovers), never when it is flatter: a slope pulled down by sessions
    that just closed says nothing about the ones that stay."""
    if growth_per_session_per_s < 0:
        raise ValueError(f"growth {growth_per_session_per_s} ρ/s per session must be ≥ 0")
    if plateau_per_session is not None:
        return math.inf if predicted_plateau(load, plateau_per_session) < 1 else 0.0
    growth = max(load.slope_per_s or 0.0, load.live * growth_per_session_per_s) \
        + growth_per_session_per_s
    if growth <= 0:
        return math.inf
    return max(0.0, 1.0 - load.occupancy) / growth


def predicted_plateau(load: RankLoad, plateau_per_session: float | None) -> float:
    """Where ρ settles with one more session (bounded KV), else ρ now."""
    if plateau_per_session is None:
        return load.occupancy
    return max(load.occupancy, load.live * plateau_per_session) + plateau_per_session


class Placer:
    """Chooses a rank for each new session (count or headroom); `engine` is not a choice
    Metronome makes, so asking it to choose is a ValueError."""

    def __init__(self, kind: str) -> None:
        if kind not in PLACEMENTS:
            raise ValueError(f"placement {kind!r} is not one of {', '.join(PLACEMENTS)}")
        self.kind = kind
        self._start = 0  # ties rotate, as vLLM's balancer does

    @property
    def pins(self) -> bool:
        """Whether the runtime pins sessions to the rank chosen here."""
        return self.kind != "engine"

    def choose(self, loads: list[RankLoad], growth_per_session_per_s: float = 0.0,
               plateau_per_session: float | None = None, kind: str | None = None) -> int:
        """The rank for one more session. `kind` overrides this placer's (the runtime asks
        `count` where the engine will place, to guess the rank its guards should weigh)."""
        kind = kind or self.kind
        if kind == "engine":
            raise ValueError("placement engine leaves the choice to the engine; "
                             "allowed here: count, headroom")
        if not loads:
            raise ValueError("no ranks to place a session on; allowed: ≥ 1")
        n = len(loads)
        order = {load.rank: (i - self._start) % n for i, load in enumerate(loads)}
        if kind == "count":
            best = min(loads, key=lambda x: (x.live, order[x.rank]))
        else:
            best = min(loads, key=lambda x: (
                -t_sat_with_one_more_s(x, growth_per_session_per_s, plateau_per_session),
                predicted_plateau(x, plateau_per_session), order[x.rank]))
        self._start = (self._start + 1) % n
        return best.rank
