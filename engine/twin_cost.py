"""The twin's step-cost model: step_ms = a + b·tokens_in_step + c·resident_tokens + open·opens,
fitted from an engine's steps (least squares, coefficients ≥ 0), and the analytic frame latency
and session count it implies (engine/twin.py simulates with it)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    a_ms: float = 4.0  # fixed cost of one step
    b_ms_per_token: float = 0.05  # per token computed in the step (prefill + decode)
    c_ms_per_resident_token: float = 0.0005  # per KV token the step's requests attend over
    source: str = "default"  # "default" or the run_id it was fitted from
    # Per new request in the step beyond its tokens (creating and scheduling it). Not fitted:
    # the step stats do not say which step carried a first chunk. 0 until measured on vLLM.
    open_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a_ms", "b_ms_per_token", "c_ms_per_resident_token", "open_ms"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"cost coefficient {name} = {value} must be finite and ≥ 0")
        if self.a_ms == 0 and self.b_ms_per_token == 0:
            raise ValueError("cost model needs a_ms > 0 or b_ms_per_token > 0 (steps take time)")

    def step_ms(self, tokens_in_step: int, resident_tokens: int, opens: int = 0) -> float:
        return (self.a_ms + self.b_ms_per_token * tokens_in_step
                + self.c_ms_per_resident_token * resident_tokens + self.open_ms * opens)


def fit_cost_model(steps: list[dict], source: str = "fit") -> tuple[CostModel, dict]:
    """Least squares of step_ms on [1, tokens_in_step, resident_tokens], coefficients ≥ 0:
    the model and fit facts (n_steps, r2). Raises ValueError with fewer than 20 steps."""
    import numpy as np

    if len(steps) < 20:
        raise ValueError(f"{len(steps)} engine steps are too few to fit the twin (need ≥ 20)")
    y = np.array([s["step_ms"] for s in steps], dtype=float)
    x = np.column_stack([
        np.ones(len(steps)),
        [s["prompt_tokens"] + s["gen_tokens"] for s in steps],
        [s["resident_tokens"] for s in steps],
    ]).astype(float)
    # Drop the slowest 5%: scheduler hiccups and GC pauses are not the cost model.
    keep = y <= np.quantile(y, 0.95)
    x, y = x[keep], y[keep]
    active = [0, 1, 2]
    while True:  # non-negative least squares by elimination (3 terms: at most 3 rounds)
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    full = np.zeros(3)
    full[active] = np.clip(coef, 0, None)
    pred = x @ full
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1.0
    if full[0] == 0 and full[1] == 0:
        full[0] = float(y.mean())
    model = CostModel(float(full[0]), float(full[1]), float(full[2]), source=source)
    return model, {"n_steps": int(len(y)), "r2": 1 - ss_res / ss_tot}


def synchronized_frame_ms(cost: CostModel, sessions: int, tokens_in: int, tokens_out: int,
                          resident_tokens: int) -> float:
    """Analytic frame latency when `sessions` submit together and each attends over
    `resident_tokens`: one prefill step for all chunks, then tokens_out − 1 decode steps."""
    prefill = cost.step_ms(sessions * tokens_in, sessions * resident_tokens)
    decode = cost.step_ms(sessions, sessions * resident_tokens)
    return prefill + (tokens_out - 1) * decode


def analytic_n_star(cost: CostModel, target_ms: float, tokens_in: int, tokens_out: int,
                    resident_tokens: int, n_max: int = 10_000) -> int:
    """The largest session count whose synchronized frame latency stays within target_ms."""
    n = 0
    while n < n_max and synchronized_frame_ms(cost, n + 1, tokens_in, tokens_out,
                                              resident_tokens) <= target_ms:
        n += 1
    return n
