"""A long run written straight into a store with DuckDB SQL (no twin, no writer): the frames,
ticks, events and runs row a recorded run of `sessions` sessions at `frame_ms` frames would
leave, N frames long. For benchmarks of the readers (benchmarks/live_page.py); minutes of
recording become seconds.

What the rows look like: session s submits frame k at k·T + s·T/sessions; latencies are
log-normal around 35 ms (σ 0.35, so a few % pass the 80 ms budget and are late); 0.3 % of
frames are silent for compute (no answer by the deadline: censored), and every hour of run
has a 10 s stall in which every frame is silent for memory (censored) with ρ pinned at 1.
The ticks (one per T) carry live, cap, ρ, stalled, overrun and t_sat like the runtime's.
"""

from __future__ import annotations

import datetime as dt
import json

STALL_EVERY_S = 3600.0
STALL_FOR_S = 10.0


def synthesise(con, run_id: str, frames: int, sessions: int = 64, frame_ms: float = 80.0,
               seed: float = 0.42) -> dict:
    """Write the run (one transaction per table) and return its runs row as a dict."""
    T = frame_ms / 1e3
    ticks = -(-frames // sessions)
    duration = ticks * T
    con.execute("SELECT setseed(?)", [seed])
    stall = (f"(({{t}}) % {STALL_EVERY_S}) >= {STALL_EVERY_S / 2} AND "
             f"(({{t}}) % {STALL_EVERY_S}) < {STALL_EVERY_S / 2 + STALL_FOR_S}")
    con.execute(f"""
        INSERT INTO frames BY NAME
        WITH g AS (
            SELECT i, i % {sessions} AS session_id, i // {sessions} AS frame_idx,
                   (i // {sessions}) * {T} + (i % {sessions}) * {T / sessions} AS t_submit,
                   exp(ln(35.0) + 0.35 * sqrt(-2 * ln(1 - random()))
                       * cos(2 * pi() * random())) AS lat,
                   random() < 0.003 AS compute_silent
            FROM range({frames}) r(i)),
        s AS (SELECT *, compute_silent OR ({stall.format(t='t_submit')}) AS silent,
                     {stall.format(t='t_submit')} AS stalled FROM g)
        SELECT '{run_id}' AS run_id, session_id, frame_idx, t_submit,
               CASE WHEN silent THEN NULL ELSE t_submit + lat / 2e3 END AS t_first,
               CASE WHEN silent THEN NULL ELSE t_submit + lat / 1e3 END AS t_done,
               t_submit + {T} AS deadline,
               CASE WHEN silent THEN NULL ELSE lat END AS latency_ms,
               CASE WHEN silent THEN {frame_ms} * 1.5 ELSE lat END AS naive_latency_ms,
               CASE WHEN silent THEN 0 ELSE 3 END AS tokens_out, 3 AS tokens_expected,
               NOT silent AND lat <= {frame_ms} AS on_time,
               NOT silent AND lat <= {frame_ms} AS naive_on_time,
               silent, false AS skipped, NOT silent AS complete, silent AS censored,
               CASE WHEN silent THEN {frame_ms} * 1.5 ELSE lat END AS latency_bound_ms,
               CASE WHEN stalled THEN 'memory' WHEN silent THEN 'compute' END AS silent_cause,
               NULL::INTEGER AS rank, 'synthetic' AS origin
        FROM s""")
    con.execute(f"""
        INSERT INTO ticks BY NAME
        SELECT '{run_id}' AS run_id, k AS tick, k * {T} AS t, {sessions} AS live,
               {sessions} AS limit_sessions,
               CASE WHEN {stall.format(t=f'k * {T}')} THEN 1.0
                    ELSE 0.55 + 0.1 * sin(k / 500.0) END AS occupancy,
               4096 AS total_blocks, {sessions} AS running, 0 AS waiting, 0 AS paused,
               {sessions} AS admitted, 0 AS rejected, 0 AS evicted,
               random() * 2 AS overrun_ms, {sessions} * 3 AS tokens_out, 0 AS frames_waiting,
               {stall.format(t=f'k * {T}')} AS stalled, 40.0 AS p95_ms, 0.003 AS silent_rate,
               NULL::DOUBLE AS tsat_s, 0.0 AS rho_slope_per_s, 128 AS window_tokens,
               0 AS sink_tokens, NULL::INTEGER AS n_star
        FROM range({ticks}) r(k)""")
    con.execute("UPDATE ticks SET used_blocks = CAST(occupancy * total_blocks AS INTEGER) "
                "WHERE run_id = ?", [run_id])
    stalls = [h * STALL_EVERY_S + STALL_EVERY_S / 2
              for h in range(int(duration // STALL_EVERY_S) + 1)
              if h * STALL_EVERY_S + STALL_EVERY_S / 2 < duration]
    now = dt.datetime.now()
    for t in stalls:
        con.execute("INSERT INTO events VALUES (?, ?, ?, 'stall', ?)",
                    [run_id, t, now, json.dumps({"since": t, "ticks": 2})])
    row = {"run_id": run_id, "started_at": now - dt.timedelta(seconds=duration),
           "ended_at": now, "status": "finished", "engine": "twin", "simulated": True,
           "model": "synthetic", "policy": "window", "window_tokens": 128, "sink_tokens": 0,
           "pool_blocks": 4096, "frame_ms": frame_ms, "budget_ms": frame_ms, "tokens_in": 8,
           "tokens_out": 3, "load": "fixed", "sessions": sessions, "duration_s": duration,
           "admission": "fixed", "stall_guard": "off", "memory_guard": "off", "seed": 0,
           "summary": json.dumps({"frames": frames})}
    con.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                list(row.values()))
    con.execute("INSERT INTO settings_history (run_id, t, setting, change, policy, "
                "window_tokens, sink_tokens) VALUES (?, 0, 'start', 'start', 'window', 128, 0)",
                [run_id])
    return row
