"""Chart builders: pure functions from DataFrames to Altair specs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app import charts


@pytest.mark.parametrize("build", [
    lambda df: charts.latency_chart(df, 80.0, 64.0),
    charts.occupancy_chart,
    charts.silent_chart,
    charts.sessions_chart,
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


def test_session_wall_paints_silent_cells_dark_and_busy_cells_darker_green():
    df = pd.DataFrame({"session_id": [3, 3, 7, 9], "t": [0.0, 1.0, 0.0, 2.0],
                       "t_end": [1.0, 2.0, 1.0, 3.0], "tokens": [40, 10, 0, 40],
                       "frames": [10, 10, 10, 10], "silent_share": [0.0, 0.0, 1.0, 0.0]})
    image, caption = charts.session_wall_image(df, span_s=4.0, bucket_s=1.0)
    rows, cols = 3, 4
    h, w = image.shape[0] // rows, image.shape[1] // cols
    assert image.shape == (rows * h, cols * w, 3) and image.dtype == np.uint8
    cell = {(r, c): tuple(image[r * h, c * w]) for r in range(rows) for c in range(cols)}
    assert cell[(1, 0)] == charts._hex_rgb(charts.SILENT_COLOUR)  # session 7 went quiet
    assert cell[(0, 0)] == cell[(2, 2)] == charts._GREEN_HIGH  # the busiest cells
    assert sum(map(int, cell[(0, 1)])) > sum(map(int, cell[(0, 0)]))  # fewer tokens: lighter
    assert cell[(0, 3)] == cell[(1, 1)] == charts._EMPTY  # no frame there
    assert "sessions 3–9" in caption and "1 s per column" in caption
    empty, text = charts.session_wall_image(df.iloc[:0], span_s=4.0, bucket_s=1.0)
    assert text == "no frames yet" and (empty == charts._EMPTY).all()


def test_truth_and_lie_share_their_latency_axis():
    df = pd.DataFrame({"t": [0.0, 1.0], "p95_ms": [50.0, 400.0], "naive_p95_ms": [40.0, 40.0],
                       "miss_rate": [0.0, 1.0], "naive_miss_rate": [0.0, 0.0]})
    naive, truth = (c.to_dict() for c in charts.truth_and_lie(df, 80.0))
    y = [c["vconcat"][0]["layer"][0]["encoding"]["y"]["scale"]["domain"] for c in (naive, truth)]
    assert y[0] == y[1] == [0, 400.0]
    assert "Naive" in naive["title"] and "Truthful" in truth["title"]
