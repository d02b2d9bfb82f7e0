"""DuckDB schema. Extend tables, never rename columns: reports and scripts read them."""

RUN_STATUSES = ("running", "finished", "failed", "aborted")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    started_at TIMESTAMP,
    ended_at TIMESTAMP,
    status VARCHAR,
    reason VARCHAR,
    engine VARCHAR,
    simulated BOOLEAN,
    model VARCHAR,
    policy VARCHAR,
    window_tokens INTEGER,
    sink_tokens INTEGER,
    block_size INTEGER,
    pool_blocks INTEGER,
    frame_ms DOUBLE,
    budget_ms DOUBLE,
    tokens_in INTEGER,
    tokens_out INTEGER,
    wait_budget DOUBLE,
    load VARCHAR,
    sessions INTEGER,
    arrival_rate DOUBLE,
    session_s DOUBLE,
    duration_s DOUBLE,
    admission VARCHAR,
    target DOUBLE,
    stall_guard VARCHAR,
    seed INTEGER,
    settings VARCHAR,
    summary VARCHAR
);
CREATE TABLE IF NOT EXISTS frames (
    run_id VARCHAR,
    session_id INTEGER,
    frame_idx INTEGER,
    t_submit DOUBLE,
    t_first DOUBLE,
    t_done DOUBLE,
    deadline DOUBLE,
    latency_ms DOUBLE,
    naive_latency_ms DOUBLE,
    tokens_out INTEGER,
    tokens_expected INTEGER,
    on_time BOOLEAN,
    naive_on_time BOOLEAN,
    silent BOOLEAN,
    skipped BOOLEAN,
    complete BOOLEAN
);
CREATE TABLE IF NOT EXISTS ticks (
    run_id VARCHAR,
    tick INTEGER,
    t DOUBLE,
    live INTEGER,
    limit_sessions INTEGER,
    occupancy DOUBLE,
    used_blocks INTEGER,
    total_blocks INTEGER,
    running INTEGER,
    waiting INTEGER,
    paused INTEGER,
    admitted INTEGER,
    rejected INTEGER,
    evicted INTEGER,
    overrun_ms DOUBLE,
    tokens_out INTEGER,
    frames_waiting INTEGER,
    stalled BOOLEAN
);
CREATE TABLE IF NOT EXISTS events (
    run_id VARCHAR,
    t DOUBLE,
    wall_at TIMESTAMP,
    kind VARCHAR,
    detail VARCHAR
);
CREATE TABLE IF NOT EXISTS steps (
    run_id VARCHAR,
    t DOUBLE,
    step_ms DOUBLE,
    prompt_tokens INTEGER,
    gen_tokens INTEGER,
    used_blocks INTEGER,
    resident_tokens INTEGER,
    running INTEGER
);
CREATE TABLE IF NOT EXISTS twin_models (
    fitted_at TIMESTAMP,
    source_run_id VARCHAR,
    a_ms DOUBLE,
    b_ms_per_token DOUBLE,
    c_ms_per_resident_token DOUBLE,
    r2 DOUBLE,
    n_steps INTEGER
);
-- One row per calibration: an engine + model on one machine, its fitted step cost and the
-- compute limit N_c measured with a bounded window (services/calibration.py); the newest row wins.
CREATE TABLE IF NOT EXISTS calibrations (
    calibrated_at TIMESTAMP,
    engine VARCHAR,
    model VARCHAR,
    machine VARCHAR,
    n_c INTEGER,
    n_c_estimate INTEGER,
    target_ms DOUBLE,
    frame_ms DOUBLE,
    tokens_in INTEGER,
    tokens_out INTEGER,
    block_size INTEGER,
    window_tokens INTEGER,
    sink_tokens INTEGER,
    a_ms DOUBLE,
    b_ms_per_token DOUBLE,
    c_ms_per_resident_token DOUBLE,
    r2 DOUBLE,
    n_steps INTEGER,
    probes VARCHAR,
    seconds DOUBLE
);
-- Schedules are defined here, not in APScheduler: this table is the source of truth and the
-- scheduler's jobs are rebuilt from it at every start (services/scheduler.py).
CREATE TABLE IF NOT EXISTS schedules (
    schedule_id VARCHAR PRIMARY KEY,
    name VARCHAR,
    kind VARCHAR,
    trigger VARCHAR,
    every_s DOUBLE,
    cron VARCHAR,
    params VARCHAR,
    misfire_grace_s DOUBLE,
    busy_wait_s DOUBLE,
    drift_threshold DOUBLE,
    paused BOOLEAN,
    created_at TIMESTAMP
);
-- One row per fire (or missed/skipped fire) of a schedule; run_ids is a JSON list.
CREATE TABLE IF NOT EXISTS schedule_fires (
    fire_id VARCHAR,
    schedule_id VARCHAR,
    due_at TIMESTAMP,
    started_at TIMESTAMP,
    ended_at TIMESTAMP,
    status VARCHAR,
    reason VARCHAR,
    run_ids VARCHAR,
    n_star DOUBLE,
    t_sat_s DOUBLE,
    n_star_change DOUBLE,
    t_sat_change DOUBLE,
    drifted BOOLEAN,
    drift_note VARCHAR,
    detail VARCHAR
);
-- Retention: each run moved to Parquet (or why it was not).
CREATE TABLE IF NOT EXISTS archives (
    run_id VARCHAR,
    archived_at TIMESTAMP,
    status VARCHAR,
    reason VARCHAR,
    path VARCHAR,
    row_counts VARCHAR
);
CREATE INDEX IF NOT EXISTS frames_run ON frames (run_id);
CREATE INDEX IF NOT EXISTS ticks_run ON ticks (run_id);
"""

# Rollups (store/rollups.py): per run, level (bucket seconds) and bucket start t, written with the
# frames and ticks in the same transaction; rows with one key add up.
ROLLUP_SCHEMA = """
CREATE TABLE IF NOT EXISTS frame_rollups (
    run_id VARCHAR, level_s INTEGER, t DOUBLE, frames INTEGER, silent INTEGER,
    silent_memory INTEGER, silent_compute INTEGER, silent_guard INTEGER, silent_other INTEGER,
    censored INTEGER, late INTEGER, misses INTEGER, naive_misses INTEGER, tokens_out BIGINT);
CREATE TABLE IF NOT EXISTS latency_rollups (
    run_id VARCHAR, level_s INTEGER, t DOUBLE, bin SMALLINT, n INTEGER, naive_n INTEGER);
CREATE TABLE IF NOT EXISTS wall_rollups (
    run_id VARCHAR, level_s INTEGER, t DOUBLE, session_id INTEGER, frames INTEGER,
    silent INTEGER, tokens BIGINT);
CREATE TABLE IF NOT EXISTS tick_rollups (
    run_id VARCHAR, level_s INTEGER, t DOUBLE, ticks INTEGER, t_last DOUBLE, live INTEGER,
    limit_sessions INTEGER, used_blocks INTEGER, total_blocks INTEGER, admitted INTEGER,
    rejected INTEGER, evicted INTEGER, tsat_s DOUBLE, rho_slope_per_s DOUBLE, n_star INTEGER,
    occupancy DOUBLE, stalled BOOLEAN, max_overrun_ms DOUBLE, first_flowing_t DOUBLE,
    tsat_made_t DOUBLE);
-- Where each stall ended: its event's t and the first tick after it that flowed again
-- (store/stall_ends.py); no row while it lasts.
CREATE TABLE IF NOT EXISTS stall_ends (run_id VARCHAR, t_event DOUBLE, t_end DOUBLE);
"""

# Columns added after a table first shipped: applied to existing files on open.
MIGRATIONS = """
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS p95_ms DOUBLE;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS silent_rate DOUBLE;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS tsat_s DOUBLE;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS rho_slope_per_s DOUBLE;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS memory_guard VARCHAR;
ALTER TABLE frames ADD COLUMN IF NOT EXISTS censored BOOLEAN;
ALTER TABLE frames ADD COLUMN IF NOT EXISTS latency_bound_ms DOUBLE;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS window_tokens INTEGER;
ALTER TABLE frames ADD COLUMN IF NOT EXISTS silent_cause VARCHAR;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS silent_memory INTEGER;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS silent_compute INTEGER;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS silent_guard INTEGER;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS silent_other INTEGER;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS sink_tokens INTEGER;
ALTER TABLE ticks ADD COLUMN IF NOT EXISTS n_star INTEGER;
CREATE TABLE IF NOT EXISTS settings_history (
    run_id VARCHAR,
    t DOUBLE,
    setting VARCHAR,
    change VARCHAR,
    policy VARCHAR,
    window_tokens INTEGER,
    sink_tokens INTEGER,
    target DOUBLE,
    admission VARCHAR,
    limit_sessions INTEGER,
    stall_guard BOOLEAN,
    memory_guard BOOLEAN
);
ALTER TABLE frames ADD COLUMN IF NOT EXISTS rank INTEGER;
-- The output ids a frame had by its deadline, where the backend reports them (its words).
ALTER TABLE frames ADD COLUMN IF NOT EXISTS out_ids INTEGER[];
-- Data parallelism: one row per rank per tick (ticks keeps the whole engine's pool). Written
-- only for runs with more than one rank.
CREATE TABLE IF NOT EXISTS rank_ticks (
    run_id VARCHAR,
    tick INTEGER,
    t DOUBLE,
    rank INTEGER,
    live INTEGER,
    occupancy DOUBLE,
    used_blocks INTEGER,
    total_blocks INTEGER,
    running INTEGER,
    waiting INTEGER,
    paused INTEGER,
    tokens_out INTEGER,
    frames_waiting INTEGER,
    stalled BOOLEAN,
    frames INTEGER,
    silent_frames INTEGER,
    tsat_s DOUBLE,
    rho_slope_per_s DOUBLE
);
CREATE INDEX IF NOT EXISTS rank_ticks_run ON rank_ticks (run_id);
-- The floating-point type the model ran in and why (engine/dtype.py); NULL: simulated.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS dtype VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS dtype_reason VARCHAR;
-- Calibrations per dtype, with N_c at each frame period tried (services/calibration.py).
ALTER TABLE calibrations ADD COLUMN IF NOT EXISTS dtype VARCHAR;
ALTER TABLE calibrations ADD COLUMN IF NOT EXISTS periods VARCHAR;
-- Where a frame's session came from: the run's load kind, or "gateway" for a remote client
-- (a frame the load client recorded: "client").
ALTER TABLE frames ADD COLUMN IF NOT EXISTS origin VARCHAR;
-- Why a schedule cannot run (its trace deleted, settings no longer valid); NULL: it can.
-- Set when a scheduler starts; an invalid schedule is skipped, the others still fire.
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS invalid VARCHAR;
""" + ROLLUP_SCHEMA

TABLES = ("runs", "frames", "ticks", "events", "steps", "twin_models", "settings_history",
          "rank_ticks", "calibrations")
# every row keyed by one run_id (retention moves these)
ROLLUP_TABLES = ("frame_rollups", "latency_rollups", "wall_rollups", "tick_rollups",
                 "stall_ends")
RUN_TABLES = ("runs", "frames", "ticks", "events", "steps", "settings_history", "rank_ticks",
              *ROLLUP_TABLES)
FIRE_STATUSES = ("running", "finished", "failed", "skipped", "missed", "interrupted")
