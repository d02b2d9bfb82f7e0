"""Replay of a recorded run: its trace (arrivals, session lengths, tokens per frame) read from
the store or its archive. Installed into load_gen.trace_load at import, so the load generator
never imports the store (runtime → {load_gen, store})."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from load_gen.generated import planned_arrivals
from load_gen.trace_load import (RECORDED_FIELDS, ReplaySession, ReplayTrace, check_config,
                                 compact_counts, file_trace, session_start)


def trace_for(load) -> ReplayTrace | None:
    """The trace a LoadConfig replays (None for any other load): a recorded run's, from the
    store or its archive, or a trace file's; read once per source, then cached."""
    if load.kind != "replay":
        return None
    if load.replay_run is not None:
        return recorded_trace(load.replay_run, load.replay_db)
    return file_trace(load.replay_trace, load.frame_ms)


def checked_trace(cfg) -> ReplayTrace | None:
    """A RunConfig's replay trace, read, with the settings under which the replay would not
    offer the traced load refused (ValueError); None for other loads. A RunConfig reads no
    file or database when built: the runner calls this before anything starts, the CLI and
    the console's forms call it first to refuse at once."""
    trace = trace_for(cfg.load_config())
    if trace is not None:
        check_config(trace, cfg.frame_ms, cfg.tokens_out, cfg.stagger)
    return trace


def recording_settings(replay_run: str | None = None, replay_trace: str | None = None,
                       replay_db: str | None = None, frame_ms: float | None = None) -> dict:
    """The RunConfig load fields a replay takes from its recording (a file trace fixes only
    sessions and duration; its frame period is the operator's, `frame_ms`)."""
    if (replay_run is None) == (replay_trace is None):
        raise ValueError("load replay needs exactly one of --replay-run (a recorded run) or "
                         "--replay-trace (a CSV or Parquet file)")
    if replay_run is not None:
        return dict(recorded_trace(replay_run, replay_db).settings)
    if frame_ms is None:
        raise ValueError("a trace file's frames are cut at the run's frame period: give one")
    return dict(file_trace(replay_trace, frame_ms).settings)


def recorded_trace(run_id: str, db: str | None = None) -> ReplayTrace:
    from store import db_path

    path = db_path(db)
    key = path if path == ":memory:" else str(Path(path).expanduser().resolve())
    return _recorded_trace(key, run_id)


# A finished run never changes (archiving moves it unchanged). Few kept: a recorded trace holds
# tokens out per frame for up to 100k sessions, and a replay needs one (or its source's) at once.
@lru_cache(maxsize=4)
def _recorded_trace(db: str, run_id: str) -> ReplayTrace:
    from store import archive, open_store, queries

    store = open_store(db)
    cur = store.cursor()
    row = queries.run_row(cur, run_id)
    archived = None
    if row is None and run_id in archive.archived_runs(store.path):
        archived = archive.open_archived(store.path, run_id)
        cur = archived
        row = queries.run_row(cur, run_id)
    if row is None:
        raise ValueError(f"run {run_id!r} is not in {store.path} (nor in its archive)")
    try:
        return _from_recording(cur, row, db)
    finally:
        if archived is not None:
            archived.close()


def _from_recording(cur, row: dict, db: str) -> ReplayTrace:
    from store import replay_queries as queries

    run_id = row["run_id"]
    if row["status"] != "finished":
        raise ValueError(f"run {run_id} is {row['status']}; only a finished run can be replayed")
    s = json.loads(row["settings"])
    settings = {k: s[k] for k in RECORDED_FIELDS}
    if s["load"] == "replay":  # the same load as its own source, by construction
        source = (recorded_trace(s["replay_run"], s.get("replay_db") or db)
                  if s.get("replay_run") else file_trace(s["replay_trace"], s["frame_ms"]))
        return ReplayTrace(f"run {run_id}", source.arrivals, source.sessions, s["frame_ms"],
                           s["stagger"], settings)
    frame_s = s["frame_ms"] / 1e3
    arrivals = planned_arrivals(s["load"], s["sessions"], s["arrival_rate"], s["duration_s"],
                                s["seed"], s["frame_ms"])
    recorded = {int(r.session_id): r for r in
                queries.replay_frames(cur, run_id, frame_s).itertuples()}
    outcomes = queries.session_outcomes(cur, run_id)
    unknown = sorted(set(recorded) - set(range(len(arrivals))))
    if unknown:
        raise ValueError(f"run {run_id} recorded session(s) {unknown[:5]} that its settings "
                         f"never offered; it cannot be replayed exactly")
    starts, sessions = [], []
    for i, arrival in enumerate(arrivals):
        start = session_start(arrival, i, frame_s, s["stagger"], s["load"])
        rec = recorded.get(i)
        # A later start is the open budget deferring it by ticks (runtime/opens.py): the
        # replay re-offers the arrival, and its own budget defers it again. Earlier is wrong.
        if rec is not None and rec.start_s - start < -frame_s / 2:
            raise ValueError(f"run {run_id}: session {i} started at {rec.start_s:.3f} s, its "
                             f"settings say {start:.3f} s; it cannot be replayed exactly")
        end = min(s["duration_s"], start + s["session_s"]) if s["session_s"] else s["duration_s"]
        planned = max(0, math.ceil((end - start) / frame_s - 1e-9))
        n_rec = 0 if rec is None else int(rec.frames)
        # Sessions cut short by the system, or still running at the end, get their planned
        # length; a session its source ended (a WAV file without loop) keeps what it sent.
        n = planned if (i in outcomes or n_rec >= planned - 1) else n_rec
        asked = [] if rec is None else [int(x) for x in rec.tokens_out][:n]
        tokens_out = compact_counts(asked + [s["tokens_out"]] * (n - len(asked)), s["tokens_out"])
        starts.append(start)
        sessions.append(ReplaySession(n, s["tokens_in"], tokens_out))
    if s["stagger"] and s["load"] == "fixed":
        # The runtime phases staggered sessions only for load fixed; a replay (with stagger)
        # starts each session at its arrival, so offering the phased starts keeps them.
        arrivals = starts
    return ReplayTrace(f"run {run_id}", tuple(arrivals), tuple(sessions), s["frame_ms"],
                       s["stagger"], settings)


