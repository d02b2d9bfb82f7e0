"""Chart builders: pure functions from DataFrames to Altair specs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from services import chart_marks
from services import charts


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


def _layer_with(spec: dict, channel: str) -> dict:
    return next(layer for layer in spec["layer"] if channel in layer.get("encoding", {}))


def _data(spec: dict, layer: dict) -> list[dict]:
    return spec["datasets"][layer["data"]["name"]]


def test_latency_chart_draws_the_budget_and_dashes_the_naive_p95():
    df = pd.DataFrame({"t": [0.0, 1.0], "p50_ms": [10.0, 12.0], "p95_ms": [20.0, 25.0],
                       "p99_ms": [30.0, 90.0], "naive_p95_ms": [20.0, 24.0], "frames": [8, 8]})
    spec = charts.latency_chart(df, 80.0).to_dict()

    datasets = list(spec["datasets"].values())
    assert any({"label": "budget 80 ms", "ms": 80.0} in d for d in datasets)
    lines = _layer_with(spec, "strokeDash")
    dash = lines["encoding"]["strokeDash"]["scale"]
    naive = dash["domain"].index(charts.NAIVE_LABEL)
    assert dash["range"][naive] != dash["range"][0]
    row = next(r for r in _data(spec, lines) if r["t"] == 1.0 and r["series"] == "p99")
    assert row["shown"] == 90.0 and row["value"] == "90.0 ms"


def test_a_censored_percentile_goes_into_the_missed_band_not_onto_the_budget():
    df = pd.DataFrame({"t": [0.0, 1.0], "p50_ms": [10.0, 60.0], "p95_ms": [20.0, np.inf],
                       "p99_ms": [30.0, np.inf], "naive_p95_ms": [20.0, 40.0], "frames": [8, 8]})
    spec = charts.latency_chart(df, 80.0).to_dict()
    lines = _layer_with(spec, "strokeDash")
    top = lines["encoding"]["y"]["scale"]["domain"][1]
    assert top == pytest.approx(80.0 * 1.3)  # finite values only set the axis
    censored = [r for r in _data(spec, lines) if r["t"] == 1.0 and r["series"] in ("p95", "p99")]
    assert all(r["value"] == "> budget (censored)" for r in censored)
    assert all(0.9 * top < r["shown"] <= top for r in censored)  # in the band, above budget
    band = next(d for d in spec["datasets"].values() if d and "lo" in d[0])
    assert band[0]["label"] == chart_marks.MISSED_LABEL and band[0]["lo"] > 80.0


def test_time_charts_mark_stalls_changes_and_the_tsat_prediction():
    marks = charts.Marks(
        stalls=pd.DataFrame({"t_start": [6.3], "t_end": [10.0],
                             "label": ["pool full, no token for 2 ticks: silent stall"]}),
        changes=pd.DataFrame({"t": [4.5], "change": ["W 128 → 32"]}),
        tsat={"t_made": 2.0, "rho_made": 0.5, "t_full": 6.0,
              "label": "t_sat predicted at 2.0 s: full at 6.0 s"})
    empty = pd.DataFrame()
    for chart in (charts.latency_chart(empty, 80.0, marks=marks),
                  charts.occupancy_chart(empty, marks=marks),
                  charts.silent_chart(empty, marks=marks),
                  charts.sessions_chart(empty, marks=marks)):
        rows = [r for d in chart.to_dict()["datasets"].values() for r in d]
        labels = {r.get("label") for r in rows} | {r.get("change") for r in rows}
        assert "pool full, no token for 2 ticks: silent stall" in labels
        assert "W 128 → 32" in labels
    occ = [r for d in charts.occupancy_chart(empty, marks=marks).to_dict()["datasets"].values()
           for r in d]
    assert {"t": 6.0, "label": "t_sat predicted at 2.0 s: full at 6.0 s"} in occ


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
    assert y[0] == y[1] == [0, pytest.approx(440.0)]
    assert "Naive" in naive["title"] and "Truthful" in truth["title"]
