"""N* discovery's report: the silent share over the frames N*'s stretch judged."""

import pytest

from services import experiments
from engine.twin import CostModel, TwinEngine
from runtime import RunConfig, Runner


def _share(store, run_id, start, end):
    n, silent = store.cursor().execute(
        "SELECT count(*), count(*) FILTER (WHERE silent) FROM frames WHERE run_id = ? "
        "AND t_submit >= ? AND t_submit < ?", [run_id, start, end]).fetchone()
    return silent / n


def test_silent_at_cap_covers_the_frames_the_stretch_judged(store):
    # An unbounded pool that fills: frames go silent from some second on, so how far back the
    # share reaches changes it.
    cfg = RunConfig(engine="twin", policy="unbounded", pool_blocks=256, frame_ms=80.0,
                    load="fixed", sessions=24, duration_s=20.0)
    run = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel(4.0, 0.05, 0.00002)),
                 store).run()
    first_silent = store.cursor().execute(
        "SELECT min(t_submit) FROM frames WHERE run_id = ? AND silent",
        [run["run_id"]]).fetchone()[0]
    assert first_silent is not None and first_silent < 15.0
    # A stretch said to start 1.5 s after the first silent frame and last 2 s.
    at_s, for_s = first_silent + 1.5, 2.0
    shares = {}
    for window_s in (1.0, 3.0, None):  # None: a run recorded before the window (1 s)
        summary = {"run_id": run["run_id"], "n_star": 5, "n_star_at_s": at_s,
                   "n_star_for_s": for_s, "control_window_s": window_s}
        shares[window_s] = experiments.silent_at_cap(store.cursor(), summary)
        assert shares[window_s] == pytest.approx(
            _share(store, run["run_id"], at_s - (window_s or 1.0), at_s + for_s))
    assert shares[3.0] < shares[1.0] == shares[None]  # reaches back before the silence
    assert experiments.silent_at_cap(store.cursor(), {**summary, "n_star": None}) is None
