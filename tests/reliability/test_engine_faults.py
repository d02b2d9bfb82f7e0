"""Engine faults: one failing session ends alone; a dead vLLM engine fails the run cleanly and a
new engine starts in the same process."""

import threading
import time

import pytest

from engine.twin import CostModel, TwinEngine
from runtime import RunConfig, Runner
from store.queries import events, run_row


class _OneBadSession(TwinEngine):
    """Fault injection at the engine boundary: session 3's frames fail from 1 s on."""

    def submit(self, session_id, token_ids, max_new):
        handle = super().submit(session_id, token_ids, max_new)
        if session_id == 3 and self.now() > 1.0:
            handle.finish(self.now(), "injected session fault")
        return handle


def test_a_session_that_errors_ends_alone(store):
    cfg = RunConfig(engine="twin", policy="window", window=64, pool_blocks=64, sessions=6,
                    duration_s=5.0)
    s = Runner(cfg, _OneBadSession(cfg.engine_config(), CostModel()), store).run()
    assert s.status == "finished"
    ev = events(store.cursor(), s.run_id)
    closes = ev[ev.kind == "close"]
    assert len(closes) == 1 and "injected session fault" in closes.detail.iloc[0]
    others = store.cursor().execute(
        "SELECT session_id, count(*), sum(CASE WHEN silent THEN 1 ELSE 0 END) FROM frames "
        "WHERE run_id = ? AND session_id <> 3 AND t_submit > 2 GROUP BY 1",
        [s.run_id]).fetchall()
    # The other five kept every frame of the last 3 s (the one cut off by the end excepted).
    assert len(others) == 5 and all(n >= int(3 / 0.08) - 1 and silent == 0
                                    for _, n, silent in others)


@pytest.mark.vllm
def test_dead_vllm_engine_fails_the_run_and_a_new_engine_starts(store, vllm_engines):
    cfg = RunConfig(engine="vllm", model="tiny", policy="window", window=128, pool_blocks=64,
                    sessions=4, frame_ms=160.0, duration_s=30.0)
    # The session's shared engine of this configuration (tests/vllm_machine.py): killed here,
    # the pool's next `get` replaces it, and the modules after this one use the new engine.
    engine = vllm_engines.get(cfg)
    victims = vllm_engines.processes(cfg)
    assert victims, "no EngineCore process found"
    runner = Runner(cfg, engine, store)
    thread = threading.Thread(target=runner.run)
    thread.start()
    time.sleep(2.0)
    for proc in victims:
        proc.kill()
    thread.join(timeout=60)
    assert runner.summary.status == "failed"
    assert "engine" in runner.summary.reason.lower()
    row = run_row(store.cursor(), runner.run_id)
    assert row["status"] == "failed" and row["ended_at"] is not None
    assert engine.error() is not None

    starts = vllm_engines.starts
    again = vllm_engines.get(cfg)  # same process, fresh engine
    assert again is not engine and vllm_engines.starts == starts + 1
    s = Runner(RunConfig(**{**cfg.__dict__, "duration_s": 2.0}), again, store).run()
    assert s.status == "finished" and s.frames > 0
