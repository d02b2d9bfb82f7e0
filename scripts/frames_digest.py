"""Behaviour fingerprint of the runtime: a fixed set of seeded twin runs (unpaced, in memory)
and one SHA-256 per run over every frame's columns and every tick's pool columns, in order.
Run it before and after a refactor (e.g. in a `git worktree` of the older commit): the same
digests mean the same frames.

    .venv/bin/python scripts/frames_digest.py
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.replay_settings import with_recorded_load  # noqa: E402
from runtime import RunConfig, Runner, make_engine  # noqa: E402
from runtime.config import ScheduledChange  # noqa: E402
from store import Store  # noqa: E402

TWIN = dict(engine="twin", duration_s=8.0, pool_blocks=96)
CASES = {
    "cliff": dict(policy="unbounded", sessions=10),
    "window": dict(policy="window", window=128, sinks=32, sessions=10),
    "poisson-aimd": dict(policy="window", window=64, load="poisson", arrival_rate=4.0,
                         session_s=3.0, sessions=40, admission="aimd"),
    "ramp-stall-guard": dict(policy="unbounded", load="ramp", sessions=12, stall_guard=True),
    "live-changes": dict(policy="window", window=128, sessions=8, changes=(
        ScheduledChange.parse("2:window=64"), ScheduledChange.parse("4:target=0.5"),
        ScheduledChange.parse("5:sinks=32"))),
    "two-ranks": dict(policy="window", window=64, sessions=12, data_parallel_size=2,
                      placement="headroom"),
}
FRAMES = ("SELECT session_id, frame_idx, t_submit, t_first, t_done, deadline, latency_ms, "
          "naive_latency_ms, tokens_out, tokens_expected, on_time, naive_on_time, silent, "
          "skipped, complete FROM frames WHERE run_id = ? ORDER BY session_id, frame_idx")
TICKS = ("SELECT tick, t, live, limit_sessions, used_blocks FROM ticks WHERE run_id = ? "
         "ORDER BY tick")


def digest(store: Store, run_id: str) -> tuple[str, int]:
    h = hashlib.sha256()
    cur = store.cursor()
    rows = cur.execute(FRAMES, [run_id]).fetchall()
    for row in rows + cur.execute(TICKS, [run_id]).fetchall():
        h.update(repr(row).encode())
    return h.hexdigest()[:16], len(rows)


def run(config: RunConfig, store: Store) -> str:
    engine = make_engine(config)
    try:
        summary = Runner(config, engine, store).run()
    finally:
        engine.shutdown()
    store.writer.flush()
    return summary["run_id"]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "digest.duckdb")  # a file: the replay reads its source from it
        store = Store(db)
        try:
            run_ids = {}
            for name, case in CASES.items():
                run_ids[name] = run(RunConfig(**TWIN, **case), store)
            # The cliff's sessions offered again with a window (load replay).
            run_ids["replay-window"] = run(RunConfig(**with_recorded_load(
                {**TWIN, "load": "replay", "replay_run": run_ids["cliff"], "replay_db": db,
                 "policy": "window", "window": 128})), store)
            for name, run_id in run_ids.items():
                sha, n = digest(store, run_id)
                print(f"{name:18} {sha}  {n} frames")
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
