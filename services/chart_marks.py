"""What every time chart of a run marks: stall spans (shaded, the first labelled), live
changes as labelled rules ("W 128 → 32"), the t_sat prediction on the occupancy chart, and the
red band where censored latency percentiles ("> budget") are drawn. DataFrame in, Altair
layers out; services/charts.py lays them over its charts."""

from __future__ import annotations

from dataclasses import dataclass, field

import altair as alt
import pandas as pd

RULE = "firebrick"


def time_axis(x_domain=None, field: str = "t") -> alt.X:
    scale = alt.Scale(domain=list(x_domain)) if x_domain is not None else alt.Undefined
    return alt.X(f"{field}:Q", title="time since run start (s)", scale=scale)



MISSED = "#d62728"  # the band where censored percentiles go: no answer, latency unknown
MISSED_LABEL = "missed: no answer by the deadline (latency unknown, > budget)"


@dataclass(frozen=True)
class Marks:
    """What every time chart of a run marks: stall spans (t_start, t_end, label), applied live
    changes (t, change) and the t_sat prediction (queries.tsat_prediction), if any."""

    stalls: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["t_start", "t_end", "label"]))
    changes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["t", "change"]))
    tsat: dict | None = None


def missed_band(lo: float, hi: float) -> tuple[alt.Chart, alt.Chart]:
    """The red band at the top of a latency axis where censored percentiles are drawn."""
    band = pd.DataFrame({"lo": [lo], "hi": [hi], "label": [MISSED_LABEL]})
    rect = alt.Chart(band).mark_rect(color=MISSED, opacity=0.15).encode(
        y=alt.Y("lo:Q"), y2="hi:Q")
    text = alt.Chart(band).mark_text(
        align="left", baseline="top", dx=4, dy=2, color=MISSED, fontSize=10).encode(
        x=alt.value(0), y=alt.Y("hi:Q"), text="label:N")
    return rect, text


def mark_layers(marks: Marks | None, x_domain=None, with_tsat: bool = False
                ) -> list[alt.Chart]:
    """Layers for a time chart: stalls shaded red from their start (the first one labelled),
    live changes as labelled vertical rules ("W 128 → 32"), and on the occupancy chart the
    t_sat prediction (where it was made, where it said the pool would be full)."""
    if marks is None:
        return []
    layers = []
    if not marks.stalls.empty:
        spans = marks.stalls.assign(first=[True] + [False] * (len(marks.stalls) - 1))
        shade = alt.Chart(spans).mark_rect(color=MISSED, opacity=0.18).encode(
            time_axis(x_domain, "t_start"), x2="t_end:Q",
            tooltip=[alt.Tooltip("label:N", title="stall"),
                     alt.Tooltip("t_start:Q", title="from (s)", format=".2f"),
                     alt.Tooltip("t_end:Q", title="to (s)", format=".2f")])
        label = alt.Chart(spans[spans["first"]]).mark_text(
            align="left", baseline="bottom", dx=3, dy=-2, color=MISSED, fontWeight="bold",
            fontSize=10).encode(alt.X("t_start:Q"), y=alt.value(0), text="label:N")
        layers += [shade, label]
    if not marks.changes.empty:
        ch = marks.changes[["t", "change"]]
        layers.append(alt.Chart(ch).mark_rule(color="#555", strokeDash=[3, 3]).encode(
            alt.X("t:Q"), tooltip=[alt.Tooltip("t:Q", title="t (s)"), "change:N"]))
        layers.append(alt.Chart(ch).mark_text(align="left", baseline="top", dx=3, dy=12,
                                               color="#333", fontSize=10).encode(
            alt.X("t:Q"), y=alt.value(0), text="change:N"))
    if with_tsat and marks.tsat is not None:
        p = marks.tsat
        made = pd.DataFrame({"t": [p["t_made"]], "rho": [p["rho_made"]], "label": [p["label"]]})
        full = pd.DataFrame({"t": [p["t_full"]], "label": [p["label"]]})
        layers.append(alt.Chart(made).mark_point(shape="diamond", size=90, filled=True,
                                                 color=RULE).encode(
            alt.X("t:Q"), alt.Y("rho:Q"), tooltip=["label:N"]))
        layers.append(alt.Chart(full).mark_rule(color=RULE, strokeWidth=2).encode(
            alt.X("t:Q"), tooltip=["label:N"]))
        layers.append(alt.Chart(full).mark_text(align="right", baseline="top", dx=-3, dy=26,
                                                color=RULE, fontSize=10).encode(
            alt.X("t:Q"), y=alt.value(0), text="label:N"))
    return layers
