"""The run's row in `runs` (settings at start, status and summary at the end) and the summary
JSON itself, with the t_sat fit.

Percentiles and the occupancy curve come from the store (flushed before the summary), so the
loop keeps counters only and its memory stays flat however long the run.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from control.signals import fit_occupancy, predict_t_sat
from control.window import window_intervals
from engine.contract import Engine
from runtime.config import RunConfig
from runtime.live_settings import on_off
from runtime.record import Recorder
from store import queries

logger = logging.getLogger(__name__)




def settings_row(run_id: str, cfg: RunConfig, engine: Engine) -> dict:
    return {
        "run_id": run_id, "started_at": dt.datetime.now(), "ended_at": None,
        "status": "running", "reason": None, "engine": cfg.engine,
        "simulated": bool(engine.simulated), "model": cfg.model, "policy": cfg.policy,
        "window_tokens": cfg.window, "sink_tokens": cfg.sinks, "block_size": cfg.block_size,
        "pool_blocks": cfg.pool_blocks, "frame_ms": cfg.frame_ms, "budget_ms": cfg.budget,
        "tokens_in": cfg.tokens_in, "tokens_out": cfg.tokens_out,
        "wait_budget": cfg.wait_budget, "load": cfg.load, "sessions": cfg.sessions,
        "arrival_rate": cfg.arrival_rate, "session_s": cfg.session_s,
        "duration_s": cfg.duration_s, "admission": cfg.admission, "target": cfg.target,
        "stall_guard": on_off(cfg.stall_guard), "memory_guard": on_off(cfg.memory_guard),
        "seed": cfg.seed, "dtype": engine.dtype, "dtype_reason": engine.dtype_reason,
        "settings": json.dumps(cfg.as_dict(), default=str), "summary": None}


def write_run_start(recorder: Recorder, engine: Engine) -> None:
    row = settings_row(recorder.run_id, recorder.config, engine)
    cols = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    recorder.writer.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", list(row.values()))
    recorder.event(0.0, "start", engine=recorder.config.engine, simulated=engine.simulated)


def write_run_end(recorder: Recorder, summary: dict) -> None:
    status, reason = summary["status"], summary["reason"]
    recorder.event(summary["duration_s"], "end", status=status, reason=reason)
    recorder.writer.execute(
        "UPDATE runs SET status = ?, reason = ?, ended_at = ?, summary = ? WHERE run_id = ?",
        [status, reason, dt.datetime.now(), json.dumps(summary, default=str), recorder.run_id])


def summarise(recorder: Recorder, cursor, engine: Engine, *, status: str, reason: str | None,
              end_rel: float, sessions_offered: int, gate, final_limit: int,
              stall_at: float | None, max_resident_blocks: int, settings: dict,
              changes: list[dict], store: dict, ranks: dict | None = None,
              n_star=None, opens_deferred: int = 0, inputs: dict | None = None) -> dict:
    """The run's JSON (the fields every CLI run prints). `settings` are the live values at the
    end (policy, window, sinks, target, admission, stall_guard), `changes` the live changes in
    order, `store` what the writer lost during the run (rows_lost, store_errors), `ranks` the
    data-parallel fields (data_parallel_size, placement, ranks: per-rank max_occupancy,
    stalled, stall_at_s, frames, silent_frames; stalled_rank: the first to stall), `n_star`
    the controller's control.nstar.NStar (None: no stable stretch at the target), `inputs`
    how frames entered the model (runtime/inputs.py)."""
    cfg = recorder.config
    tot = recorder.totals
    frames = tot.frames
    run_id = recorder.run_id
    q = queries.frame_percentiles(cursor, run_id)
    occ = queries.occupancy(cursor, run_id)
    occ_t, occ_rho = occ.t.tolist(), occ.occupancy.tolist()
    stalled = stall_at is not None
    if stalled:
        cut = [i for i, t in enumerate(occ_t) if t <= stall_at + cfg.frame_s]
        tsat = predict_t_sat([occ_t[i] for i in cut], [occ_rho[i] for i in cut])
    else:
        tsat = late_t_sat(occ_t, occ_rho)

    def ms(x):
        return None if x is None else round(x, 3)

    def rate(n):
        return round(n / frames, 4) if frames else None

    return {
        "run_id": run_id, "status": status, "reason": reason,
        "engine": cfg.engine, "simulated": bool(engine.simulated), "model": cfg.model,
        "dtype": engine.dtype, "dtype_reason": engine.dtype_reason,
        # The KV settings in force at the end; `changes` says how they got there.
        "policy": settings["policy"], "window": settings["window"], "sinks": settings["sinks"],
        "block_size": cfg.block_size, "pool_blocks": cfg.pool_blocks,
        "frame_ms": cfg.frame_ms, "budget_ms": cfg.budget, "wait_budget": cfg.wait_budget,
        "tokens_in": cfg.tokens_in, "tokens_out": cfg.tokens_out,
        "sessions_offered": sessions_offered,
        "admitted": gate.admitted, "rejected": sum(gate.rejected.values()),
        "evicted": tot.evicted, "rollovers": tot.rollovers,
        # Admitted sessions whose start waited for a tick with room in the open budget.
        "open_budget": cfg.open_budget, "opens_deferred": opens_deferred,
        # Each control sample judged this many seconds of frames (control/window.py).
        "control_window_s": cfg.control_interval_s * window_intervals(
            cfg.control_window_s, cfg.control_interval_s, cfg.frame_s),
        "frames": frames, "silent_frames": tot.silent,
        # Censored: no answer when finalised, latency unknown (≥ budget); a percentile whose
        # rank falls among them is null with its *_censored flag set: "> budget".
        "censored_frames": tot.censored, "late_frames": tot.late,
        # Why frames went silent (they add up to silent_frames); memory-caused silence with no
        # total stall is a partial stall: some sessions starved for blocks while others ran.
        **{f"silent_{cause}_frames": n for cause, n in tot.silent_by_cause.items()},
        "partial_stall": tot.silent_by_cause["memory"] > 0 and not stalled,
        "silence": silence_verdict(stalled, tot),
        "silent_rate": rate(tot.silent), "on_time_rate": rate(tot.on_time),
        "naive_on_time_rate": rate(tot.naive_on_time),
        "p50_ms": ms(q["p50_ms"]), "p95_ms": ms(q["p95_ms"]), "p99_ms": ms(q["p99_ms"]),
        "p50_censored": q["p50_censored"], "p95_censored": q["p95_censored"],
        "p99_censored": q["p99_censored"],
        "naive_p95_ms": ms(q["naive_p95_ms"]),
        "max_occupancy": round(tot.max_occupancy, 4),
        "max_resident_blocks": max_resident_blocks,
        "stalled": stalled,
        "stall_at_s": None if stall_at is None else round(stall_at, 3),
        "tsat_pred_s": None if tsat is None else round(tsat, 3),
        "tsat_observed_s": next((round(t, 3) for t, r in zip(occ_t, occ_rho) if r >= 0.99),
                                None),
        "final_limit": final_limit,
        # The live count the controller held at the target over the run's last stable stretch
        # (control/nstar.py says what stable means); null when it never settled there.
        "n_star": None if n_star is None else n_star.n_star,
        "n_star_at_s": None if n_star is None else n_star.at_s,
        "n_star_for_s": None if n_star is None else n_star.for_s,
        "twin_cost_source": engine.cost_source,
        "tick_overruns": tot.overruns, "max_overrun_ms": round(tot.max_overrun_ms, 3),
        "target": settings["target"], "admission": settings["admission"],
        "stall_guard": settings["stall_guard"],
        "settings_at_start": {"policy": cfg.policy, "window": cfg.window, "sinks": cfg.sinks,
                              "target": cfg.target, "admission": cfg.admission,
                              "stall_guard": cfg.stall_guard},
        "changes": changes,
        "rows_lost": store["rows_lost"], "store_errors": store["store_errors"],
        **(ranks or {}),
        **(inputs or {}),
        "duration_s": round(end_rel, 3),
    }


def silence_verdict(stalled: bool, tot) -> str:
    """One word for the run's silence, the first thing an operator needs: stall (the pool
    stopped every session), partial stall (the pool starved some), compute (steps too slow with
    room in the pool), guard (evictions), none."""
    causes = tot.silent_by_cause
    if stalled:
        return "stall"
    if causes["memory"]:
        return "partial stall"
    if causes["compute"]:
        return "compute"
    if causes["guard"] or causes["other"]:
        return "guard" if causes["guard"] >= causes["other"] else "other"
    return "none"


def late_t_sat(occ_t: list[float], occ_rho: list[float]) -> float | None:
    """No stall: extrapolate the last third of the run; None when occupancy is flat."""
    if len(occ_t) < 6:
        return None
    n = len(occ_t)
    fit = fit_occupancy(occ_t[2 * n // 3:], occ_rho[2 * n // 3:])
    if fit is None or fit.slope_per_s < 1e-4:
        return None
    return fit.t_sat()


def settle_store(writer, run_id: str, status: str, reason: str | None, lost_before: dict,
                 storage_before: int, timeout_s: float) -> tuple[str, str | None, dict]:
    """Flush the run's rows; (status, reason, store) where a stuck store or a refused write
    fails the run with the cause, and store = what the writer lost during this run
    (rows_lost, store_errors) — the writer serves every run of the process."""
    try:
        writer.flush(timeout_s)
    except TimeoutError as exc:  # the run must not stay 'running' behind a stuck store
        # Not yet lost, not yet written: said, so rows_lost is not read as the whole loss.
        status, reason = "failed", (f"store: {exc}; {writer.health()['queued']} item(s) "
                                    "still queued; percentiles may be incomplete")
        logger.error("run %s: %s", run_id, reason)
    health = writer.health()
    if writer.storage_failures > storage_before and status != "failed":
        # The disk refused rows of this run: its record is incomplete, so it failed.
        status = "failed"
        reason = (f"store could not write ({health['storage_error'] or writer.last_error}); "
                  "the rows that reached the disk are kept")
        logger.error("run %s: %s", run_id, reason)
    lost = {table: n - lost_before.get(table, 0) for table, n in health["rows_lost"].items()
            if n > lost_before.get(table, 0)}
    return status, reason, {"rows_lost": sum(lost.values()),
                            "store_errors": {table: health["errors"][table] for table in lost}}
