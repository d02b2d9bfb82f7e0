"""Chart builders: DataFrame in, Altair chart out. No Streamlit here, so reports can reuse them.

Every field carries an explicit type: Altair infers types from the data, and an empty frame
(a run that has not written a frame yet) would otherwise leave them undefined.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

NAIVE_LABEL = "naive (gateway)"
_SERIES = {"p50_ms": "p50", "p95_ms": "p95", "p99_ms": "p99", "naive_p95_ms": NAIVE_LABEL}
_SOLID, _DASHED = [1, 0], [6, 4]
_TIME = alt.X("t:Q", title="time since run start (s)")


def latency_chart(df: pd.DataFrame, budget_ms: float, target_ms: float | None = None) -> alt.Chart:
    """True frame latency p50/p95/p99 per time bucket against the budget.

    The gateway's p95 is dashed: it is capped at the wait budget, so it stays under the line
    while frames go silent; showing both is the point of the chart.
    """
    long = _melt(df, list(_SERIES), "series", "ms").assign(series=lambda d: d.series.map(_SERIES))
    names = list(_SERIES.values())
    lines = alt.Chart(long).mark_line(point=True).encode(
        _TIME,
        alt.Y("ms:Q", title="frame latency (ms)"),
        alt.Color("series:N", title=None, scale=alt.Scale(domain=names)),
        alt.StrokeDash("series:N", title=None,
                       scale=alt.Scale(domain=names, range=[_SOLID] * 3 + [_DASHED])),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), "series:N",
                 alt.Tooltip("ms:Q", format=".1f")],
    )
    lines_df = pd.DataFrame({"label": [f"budget {budget_ms:g} ms"], "ms": [float(budget_ms)]})
    if target_ms is not None:
        lines_df.loc[1] = [f"target {target_ms:g} ms", float(target_ms)]
    rules = alt.Chart(lines_df).encode(alt.Y("ms:Q"))
    rule = rules.mark_rule(color="firebrick", strokeWidth=2)
    label = rules.mark_text(align="left", dx=4, dy=-6, color="firebrick").encode(
        x=alt.value(0), text="label:N")
    return alt.layer(lines, rule, label).properties(title="Frame latency vs budget")


def occupancy_chart(df: pd.DataFrame) -> alt.Chart:
    """KV pool occupancy ρ in [0, 1]; a fixed domain so a plateau never looks like a climb."""
    data = _columns(df, ["t", "occupancy", "used_blocks", "total_blocks", "live"])
    return alt.Chart(data).mark_area(line=True, opacity=0.3).encode(
        _TIME,
        alt.Y("occupancy:Q", title="pool occupancy ρ", scale=alt.Scale(domain=[0, 1])),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), alt.Tooltip("occupancy:Q", format=".3f"),
                 "used_blocks:Q", "total_blocks:Q", alt.Tooltip("live:Q", title="sessions")],
    ).properties(title="KV pool occupancy")


def silent_chart(df: pd.DataFrame) -> alt.Chart:
    """Silent frames (no output token by the deadline) per second: the failure users hear."""
    data = _columns(df, ["t", "silent_per_s", "frames"])
    return alt.Chart(data).mark_bar(color="darkorange").encode(
        _TIME,
        alt.Y("silent_per_s:Q", title="silent frames / s"),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), "silent_per_s:Q", "frames:Q"],
    ).properties(title="Silent frames per second")


def _columns(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The chart's columns only; an empty frame may lack them all."""
    if df.empty:
        return pd.DataFrame(columns=columns)
    return df[columns]


def _melt(df: pd.DataFrame, value_columns: list[str], var: str, value: str) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=["t", var, value])
    return df.melt(id_vars=["t"], value_vars=value_columns, var_name=var, value_name=value)
