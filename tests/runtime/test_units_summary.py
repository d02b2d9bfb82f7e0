"""summarise on its own: the run's JSON from the recorder's counters and two store reads
(percentiles, the occupancy curve), here given by the test."""

from types import SimpleNamespace

import pandas as pd
import pytest
from runtime_factories import ScriptedEngine, config, handle, recorder

from control.nstar import NStar
from runtime import summary as summary_module
from runtime.summary import silence_verdict, summarise

P = {"p50_ms": 20.0, "p95_ms": 35.0, "p99_ms": None, "p50_censored": False,
     "p95_censored": False, "p99_censored": True, "naive_p95_ms": 35.0}


@pytest.fixture
def store_reads(monkeypatch):
    """The store's answers: percentiles P and the occupancy curve, a tick every 0.1 s for 10 s:
    a ramp ρ = 0.1·t to 5 s, flat at 0.5 after (never observed full)."""
    ts = [k / 10 for k in range(100)]
    occupancy = pd.DataFrame({"t": ts, "occupancy": [0.1 * min(t, 5.0) for t in ts]})
    fake = SimpleNamespace(frame_percentiles=lambda cur, run_id: dict(P),
                           occupancy=lambda cur, run_id: occupancy)
    monkeypatch.setattr(summary_module, "queries", fake)


def _summary(rec, **kw):
    base = dict(status="finished", reason=None, end_rel=10.0, sessions_offered=3,
                gate=SimpleNamespace(admitted=2, rejected={"over_limit": 1, "memory_guard": 0}),
                final_limit=2, stall_at=None, max_resident_blocks=5,
                settings={"policy": "window", "window": 64, "sinks": 0, "target": 0.8,
                          "admission": "fixed", "stall_guard": False},
                changes=[], store={"rows_lost": 0, "store_errors": {}})
    return summarise(rec, None, ScriptedEngine(), **{**base, **kw})


def test_counters_rates_and_percentiles_come_through(store_reads):
    rec = recorder(config(policy="window", window=64))
    rec.frame(1, 0, 0.0, handle(0.0, (0.02,) * 4, done_at=0.02), now=0.2)
    rec.frame(1, 1, 0.08, None, now=0.2)
    s = _summary(rec)
    assert (s.frames, s.silent_frames, s.censored_frames) == (2, 1, 1)
    assert s.silent_rate == 0.5 and s.on_time_rate == 0.5
    assert (s.admitted, s.rejected, s.sessions_offered) == (2, 1, 3)
    assert s.p95_ms == 35.0 and s.p99_ms is None and s.p99_censored
    assert s.silence == "compute" and not s.partial_stall and not s.stalled
    assert s.tsat_observed_s is None
    assert s.n_star is None and s.window == 64 and s.duration_s == 10.0


def test_a_stall_fits_t_sat_on_the_curve_before_it(store_reads):
    s = _summary(recorder(), stall_at=5.0)
    assert s.stalled and s.stall_at_s == 5.0 and s.silence == "stall"
    assert s.tsat_pred_s == pytest.approx(10.0, rel=0.05)  # ρ = 0.1·t reaches 1 at 10 s


def test_no_stall_extrapolates_the_last_third_and_a_flat_end_predicts_nothing(store_reads):
    assert _summary(recorder()).tsat_pred_s is None


def test_no_frames_no_rates_and_the_ranks_and_n_star_fields_are_merged(store_reads):
    s = _summary(recorder(), n_star=NStar(3, 4.0, 5.0, intervals=6),
                 ranks={"ranks": (), "stalled_rank": None, "data_parallel_size": 1,
                        "placement": "engine"})
    assert s.silent_rate is None and s.on_time_rate is None
    assert (s.n_star, s.n_star_at_s, s.n_star_for_s) == (3, 4.0, 5.0)
    assert s.data_parallel_size == 1 and s.stalled_rank is None


@pytest.mark.parametrize("stalled, causes, verdict", [
    (True, {}, "stall"),
    (False, {"memory": 2, "compute": 5}, "partial stall"),
    (False, {"compute": 1}, "compute"),
    (False, {"guard": 2, "other": 1}, "guard"),
    (False, {"other": 2}, "other"),
    (False, {}, "none"),
])
def test_the_silence_verdict(stalled, causes, verdict):
    tot = SimpleNamespace(silent_by_cause={"memory": 0, "compute": 0, "guard": 0, "other": 0,
                                           **causes})
    assert silence_verdict(stalled, tot) == verdict
