"""The twin's cost model from measurements: a fit on an engine's steps, and the analytic
frame latency and N* it predicts (the calibration's first guess)."""

from __future__ import annotations

from engine.twin import CostModel


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
