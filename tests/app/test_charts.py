"""Chart builders: pure functions from DataFrames to Altair specs."""

from __future__ import annotations

import pandas as pd
import pytest

from app import charts


@pytest.mark.parametrize("build", [
    lambda df: charts.latency_chart(df, 80.0, 64.0),
    charts.occupancy_chart,
    charts.silent_chart,
    charts.sessions_chart,
    charts.session_wall_chart,
    lambda df: charts.limit_chart(df, 12),
    charts.collapse_chart,
    lambda df: charts.truth_and_lie(df, 80.0)[0],
])
def test_charts_accept_an_empty_frame(build):
    spec = build(pd.DataFrame()).to_dict()
    assert spec["title"]


def test_latency_chart_draws_the_budget_and_dashes_the_naive_p95():
    df = pd.DataFrame({"t": [0.0, 1.0], "p50_ms": [10.0, 12.0], "p95_ms": [20.0, 25.0],
                       "p99_ms": [30.0, 90.0], "naive_p95_ms": [20.0, 24.0], "frames": [8, 8]})
    spec = charts.latency_chart(df, 80.0).to_dict()

    datasets = list(spec["datasets"].values())
    assert {"label": "budget 80 ms", "ms": 80.0} in datasets[1]
    dash = spec["layer"][0]["encoding"]["strokeDash"]["scale"]
    naive = dash["domain"].index(charts.NAIVE_LABEL)
    assert dash["range"][naive] != dash["range"][0]
    assert {"t": 1.0, "series": "p99", "ms": 90.0} in datasets[0]


def test_occupancy_chart_is_pinned_to_zero_one():
    spec = charts.occupancy_chart(pd.DataFrame({"t": [0.0], "occupancy": [0.2],
                                                "used_blocks": [1], "total_blocks": [5],
                                                "live": [1]})).to_dict()
    assert spec["layer"][0]["encoding"]["y"]["scale"]["domain"] == [0, 1]


def test_rho_projection_runs_from_the_fit_window_to_saturation():
    line = charts.rho_projection(t=20.0, rho=0.6, slope_per_s=0.02, tsat_s=20.0, lookback_s=10.0)
    assert line.t.tolist() == [10.0, 40.0]
    assert line.rho.tolist() == pytest.approx([0.4, 1.0])
    assert charts.rho_projection(20.0, 0.6, None, None, 10.0).empty
    assert charts.rho_projection(20.0, 0.6, -0.01, None, 10.0).empty


def test_session_wall_paints_silent_cells_dark():
    df = pd.DataFrame({"session_id": [0, 1], "t": [0.0, 0.0], "t_end": [1.0, 1.0],
                       "tokens": [40, 0], "frames": [10, 10], "silent_share": [0.0, 1.0]})
    spec = charts.session_wall_chart(df).to_dict()
    assert spec["encoding"]["x2"]["field"] == "t_end"  # a cell spans its whole bucket
    colour = spec["encoding"]["color"]
    assert colour["condition"]["value"] == charts.SILENT_COLOUR
    assert "silent_share >= 0.5" in colour["condition"]["test"]
    assert colour["field"] == "tokens"


def test_truth_and_lie_share_their_latency_axis():
    df = pd.DataFrame({"t": [0.0, 1.0], "p95_ms": [50.0, 400.0], "naive_p95_ms": [40.0, 40.0],
                       "miss_rate": [0.0, 1.0], "naive_miss_rate": [0.0, 0.0]})
    naive, truth = (c.to_dict() for c in charts.truth_and_lie(df, 80.0))
    y = [c["vconcat"][0]["layer"][0]["encoding"]["y"]["scale"]["domain"] for c in (naive, truth)]
    assert y[0] == y[1] == [0, 400.0]
    assert "Naive" in naive["title"] and "Truthful" in truth["title"]
