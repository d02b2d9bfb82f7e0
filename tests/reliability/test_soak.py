"""CI's share of the soak: 30 s of a paced twin with forced rollovers (8 sessions roll over
about twice a second at max_model_len 1024; the long soaks: make soak)."""

import pytest

from benchmarks.soak import soak

pytestmark = pytest.mark.slow


def test_thirty_second_soak_is_flat_and_never_stalls(tmp_path):
    r = soak("twin", 30.0, sample_s=2.0, db=str(tmp_path / "soak.duckdb"))
    assert r["status"] == "finished" and not r["stalled"]
    assert r["rollovers"] >= 20 and r["silent_rate"] == 0
    assert r["rss_growth_mb"] < 20, r  # flat after warm-up
    assert r["tick_overruns"] <= 3, r  # the loop keeps the beat
