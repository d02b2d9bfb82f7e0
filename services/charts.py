"""Chart builders: DataFrame in, Altair chart out. No Streamlit here, so reports can reuse them.

Every field carries an explicit type: Altair infers types from the data, and an empty frame
(a run that has not written a frame yet) would otherwise leave them undefined. Builders that are
drawn side by side take `x_domain`/`y_domain`, so two runs are read on the same axes.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from services.chart_marks import RULE as _RULE
from services.chart_marks import Marks, mark_layers
from services.chart_marks import missed_band as _missed_band
from services.chart_marks import time_axis as _time

# Altair validates every schema object as it is built ("debug mode"); the top-level spec is
# still validated when it is serialised. The Live page builds its charts once a second, so
# the per-object pass is skipped.
alt.utils.schemapi.disable_debug_mode()

NAIVE_LABEL = "naive (gateway)"
_SERIES = {"p50_ms": "p50", "p95_ms": "p95", "p99_ms": "p99", "naive_p95_ms": NAIVE_LABEL}
_SOLID, _DASHED = [1, 0], [6, 4]
SILENT_COLOUR = "#161616"  # a silent cell on the session wall: the conversation went quiet


def _y_scale(y_domain):
    return alt.Scale(domain=list(y_domain)) if y_domain is not None else alt.Undefined


def latency_top(frames: list[pd.DataFrame], budget_ms: float) -> float:
    """The latency axis' top: room above the budget and every finite percentile; censored
    (infinite) percentiles are drawn in the band below it, never counted in it."""
    values = [budget_ms * 1.3] + [1.1 * x for df in frames
                                  for col in ("p95_ms", "p99_ms", "naive_p95_ms")
                                  for x in _finite(df, col)]
    return max(values)


def latency_chart(df: pd.DataFrame, budget_ms: float, target_ms: float | None = None,
                  x_domain=None, y_domain=None, title: str = "Frame latency vs budget",
                  marks: Marks | None = None) -> alt.Chart:
    """True frame latency p50/p95/p99 per time bucket against the budget (and the admission
    target when there is one).

    A percentile whose rank falls among unanswered frames is not a number ("> budget"): its
    line leaves the chart into the red band at the top, never onto the budget line. The
    gateway's p95 is dashed: it is capped at the wait budget, so it stays under the line while
    frames go silent; showing both is the point of the chart.
    """
    top = y_domain[1] if y_domain is not None else latency_top([df], budget_ms)
    band_lo = top * 0.9
    long = _melt(df, list(_SERIES), "series", "ms").assign(series=lambda d: d.series.map(_SERIES))
    censored = long.ms.astype(float).map(math.isinf) if not long.empty else long.ms
    long = long.assign(
        shown=np.where(censored, (band_lo + top) / 2, long.ms.astype(float)) if not long.empty
        else long.ms,
        value=[("> budget (censored)" if c else f"{float(m):.1f} ms") if pd.notna(m) else "—"
               for c, m in zip(censored, long.ms)])
    names = list(_SERIES.values())
    lines = alt.Chart(long).mark_line(point=True).encode(
        _time(x_domain),
        alt.Y("shown:Q", title="frame latency (ms)",
              scale=alt.Scale(domain=[0, top], clamp=True)),
        alt.Color("series:N", title=None, scale=alt.Scale(domain=names)),
        alt.StrokeDash("series:N", title=None,
                       scale=alt.Scale(domain=names, range=[_SOLID] * 3 + [_DASHED])),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), "series:N",
                 alt.Tooltip("value:N", title="latency")],
    )
    band = _missed_band(band_lo, top) if censored.any() else ()
    lines_df = pd.DataFrame({"label": [f"budget {budget_ms:g} ms"], "ms": [float(budget_ms)]})
    if target_ms is not None:
        lines_df.loc[1] = [f"target {target_ms:g} ms", float(target_ms)]
    layers = [*band, lines, *_rules(lines_df, "ms")]
    return alt.layer(*layers, *mark_layers(marks, x_domain)).properties(title=title)


def _rules(df: pd.DataFrame, field: str) -> list[alt.Chart]:
    """Horizontal reference lines with their labels at the left edge."""
    rules = alt.Chart(df).encode(alt.Y(f"{field}:Q"))
    rule = rules.mark_rule(color=_RULE, strokeWidth=2)
    label = rules.mark_text(align="left", dx=4, dy=-6, color=_RULE).encode(
        x=alt.value(0), text="label:N")
    return [rule, label]


def rho_projection(t: float, rho: float, slope_per_s: float | None, tsat_s: float | None,
                   lookback_s: float) -> pd.DataFrame:
    """The fitted line ρ(t) = ρ_now + slope·(t − t_now), drawn from `lookback_s` back (the fit's
    span) to where it reaches 1 at t_now + t_sat. Empty when there is no rising fit."""
    if slope_per_s is None or pd.isna(slope_per_s) or slope_per_s <= 0:
        return pd.DataFrame(columns=["t", "rho"])
    t0 = max(0.0, t - lookback_s)
    t1 = t + tsat_s if tsat_s is not None and not pd.isna(tsat_s) else t
    return pd.DataFrame({"t": [t0, t1],
                         "rho": [rho - slope_per_s * (t - t0), min(1.0, rho + slope_per_s * (t1 - t))]})


def occupancy_chart(df: pd.DataFrame, projection: pd.DataFrame | None = None, x_domain=None,
                    title: str = "KV pool occupancy", marks: Marks | None = None) -> alt.Chart:
    """KV pool occupancy ρ in [0, 1]; a fixed domain so a plateau never looks like a climb.
    `projection` (rho_projection) adds the fitted ρ(t) line, dashed, up to saturation."""
    data = _columns(df, ["t", "occupancy", "used_blocks", "total_blocks", "live"])
    area = alt.Chart(data).mark_area(line=True, opacity=0.3).encode(
        _time(x_domain),
        alt.Y("occupancy:Q", title="pool occupancy ρ", scale=alt.Scale(domain=[0, 1])),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), alt.Tooltip("occupancy:Q", format=".3f"),
                 "used_blocks:Q", "total_blocks:Q", alt.Tooltip("live:Q", title="sessions")],
    )
    fit = _columns(projection if projection is not None else pd.DataFrame(), ["t", "rho"])
    line = alt.Chart(fit).mark_line(color=_RULE, strokeDash=_DASHED).encode(
        _time(x_domain), alt.Y("rho:Q"),
        tooltip=[alt.Tooltip("t:Q", title="t (s)", format=".1f"),
                 alt.Tooltip("rho:Q", title="fitted ρ(t)", format=".3f")])
    return alt.layer(area, line, *mark_layers(marks, x_domain, with_tsat=True)).properties(
        title=title)


def rank_occupancy_chart(df: pd.DataFrame, x_domain=None, marks: Marks | None = None
                         ) -> alt.Chart:
    """One occupancy line per data-parallel rank (each its own pool); a stalled rank's
    buckets are marked with red points, so the rank that stalls is named, not averaged away."""
    data = _columns(df, ["t", "rank", "occupancy", "stalled", "live", "silent_frames"])
    tooltip = [alt.Tooltip("t:Q", title="t (s)"), alt.Tooltip("rank:N"),
               alt.Tooltip("occupancy:Q", format=".3f"), alt.Tooltip("live:Q", title="sessions"),
               alt.Tooltip("silent_frames:Q", title="silent frames"), "stalled:N"]
    lines = alt.Chart(data).mark_line().encode(
        _time(x_domain),
        alt.Y("occupancy:Q", title="pool occupancy ρ per rank", scale=alt.Scale(domain=[0, 1])),
        alt.Color("rank:N", title="rank"), tooltip=tooltip)
    stalled = alt.Chart(data).transform_filter(alt.datum.stalled).mark_point(
        color="red", filled=True, size=40).encode(_time(x_domain), alt.Y("occupancy:Q"),
                                                  tooltip=tooltip)
    return alt.layer(lines, stalled, *mark_layers(marks, x_domain)).properties(
        title="KV pool occupancy per rank (red: stalled)")


def silent_chart(df: pd.DataFrame, x_domain=None, marks: Marks | None = None) -> alt.Chart:
    """Silent frames (no output token by the deadline) per second: the failure users hear."""
    data = _columns(df, ["t", "silent_per_s", "frames"])
    bars = alt.Chart(data).mark_bar(color="darkorange").encode(
        _time(x_domain),
        alt.Y("silent_per_s:Q", title="silent frames / s"),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), "silent_per_s:Q", "frames:Q"],
    )
    return alt.layer(bars, *mark_layers(marks, x_domain)).properties(
        title="Silent frames per second")


def silent_share_chart(df: pd.DataFrame, x_domain=None) -> alt.Chart:
    """The share of frames that went silent per time bucket, on 0–1 for every run: servers
    with other loads or frame periods read on one axis (server_runs.silent_share_buckets)."""
    data = _columns(df, ["t", "t_end", "silent_share", "frames"])
    return alt.Chart(data).mark_rect(color="darkorange").encode(
        _time(x_domain), alt.X2("t_end:Q"),
        alt.Y("silent_share:Q", title="silent share of frames", scale=alt.Scale(domain=[0, 1]),
              axis=alt.Axis(format="%")),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"),
                 alt.Tooltip("silent_share:Q", format=".1%"), "frames:Q"],
    ).properties(title="Silent share of frames")


def silence_map_chart(df: pd.DataFrame, x_domain=None, note: str | None = None) -> alt.Chart:
    """When silence happens: sessions × time buckets, each cell its silent share (dark: every
    frame silent), on the same time axis and colour scale for every run. A chart, not the
    wall's image, so two servers line up; server_runs.silence_map bounds its rows."""
    data = _columns(df, ["session_id", "t", "t_end", "silent_share", "frames"])
    title = "When silence happens (per session)" + (f": {note}" if note else "")
    return alt.Chart(data).mark_rect().encode(
        _time(x_domain), alt.X2("t_end:Q"),
        alt.Y("session_id:O", title="session"),
        alt.Color("silent_share:Q", title="silent share",
                  scale=alt.Scale(domain=[0, 1], range=["#c7e9c0", SILENT_COLOUR])),
        tooltip=["session_id:O", alt.Tooltip("t:Q", title="t (s)"),
                 alt.Tooltip("silent_share:Q", format=".0%"), "frames:Q"],
    ).properties(title=title)


def sessions_chart(ticks: pd.DataFrame, x_domain=None, marks: Marks | None = None,
                   n_star: int | None = None) -> alt.Chart:
    """Live sessions against the admission cap on one axis, per time bucket, so it shows which
    binds (the cap at or under live: admission holds; far above it: the offered load does),
    with N* (where the controller held live at the target) as a rule when there is one."""
    long = _melt(ticks, ["live", "limit_sessions"], "series", "sessions").replace(
        {"series": {"live": "live sessions", "limit_sessions": "cap (limit)"}})
    lines = alt.Chart(long).mark_line(interpolate="step-after").encode(
        _time(x_domain),
        alt.Y("sessions:Q", title="sessions"),
        alt.Color("series:N", title=None,
                  scale=alt.Scale(domain=["live sessions", "cap (limit)"])),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), "series:N", "sessions:Q"],
    )
    rules = () if n_star is None else _rules(
        pd.DataFrame({"label": [f"N* = {n_star}"], "n": [n_star]}), "n")
    return alt.layer(lines, *rules, *mark_layers(marks, x_domain)).properties(
        title="Live sessions and cap")


WALL_WIDTH_PX = 900
_EMPTY, _GREEN_LOW, _GREEN_HIGH = (240, 240, 240), (229, 245, 224), (0, 109, 44)


def session_wall_image(df: pd.DataFrame, span_s: float, bucket_s: float
                       ) -> tuple[np.ndarray, str]:
    """Sessions × time as an RGB image (rows top to bottom by session id, one column per time
    bucket), and a caption saying how to read it. A cell is green by tokens produced (darker
    is more), dark where most frames were silent, grey where the session sent no frame, so a
    room sees conversations go quiet one by one (or all at once, at a stall).

    An image rather than a chart of rectangles: a 64-session wall over 300 buckets is ~19k
    marks that a browser would redraw every second on the machine that runs the tick.
    """
    cols = max(1, math.ceil(span_s / bucket_s))
    if df.empty:
        grid = np.full((1, cols, 3), _EMPTY, dtype=np.uint8)
        return _upscale(grid), "no frames yet"
    sessions = np.sort(df.session_id.unique())
    row = np.searchsorted(sessions, df.session_id.to_numpy())
    col = np.clip((df.t.to_numpy() / bucket_s).astype(int), 0, cols - 1)
    tokens = df.tokens.to_numpy(dtype=float)
    top = max(tokens.max(), 1.0)
    shade = (tokens / top)[:, None]
    rgb = np.asarray(_GREEN_LOW) + shade * (np.asarray(_GREEN_HIGH) - np.asarray(_GREEN_LOW))
    silent = df.silent_share.to_numpy() >= 0.5
    rgb[silent] = _hex_rgb(SILENT_COLOUR)
    grid = np.full((len(sessions), cols, 3), _EMPTY, dtype=np.uint8)
    grid[row, col] = np.rint(rgb).astype(np.uint8)
    caption = (f"Session wall: sessions {sessions[0]}–{sessions[-1]} top to bottom, "
               f"{bucket_s:g} s per column from 0 to {span_s:g} s; green = tokens out (darkest "
               f"{top:g} per cell), dark = silent, grey = no frame")
    return _upscale(grid), caption


def _upscale(grid: np.ndarray) -> np.ndarray:
    """Nearest-neighbour blow-up to about WALL_WIDTH_PX wide, rows 2–12 px high."""
    rows, cols = grid.shape[:2]
    width = max(1, WALL_WIDTH_PX // cols)
    height = int(np.clip(400 // rows, 2, 12))
    return np.repeat(np.repeat(grid, height, axis=0), width, axis=1)


def _hex_rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def truth_and_lie(df: pd.DataFrame, budget_ms: float, x_domain=None
                  ) -> tuple[alt.Chart, alt.Chart]:
    """The same frames twice, on the same axes: what a gateway dashboard shows (latency capped
    at its wait budget, an empty frame counted as on time) and what users get."""
    top = latency_top([df], budget_ms)
    naive = _p95_and_misses(df, "naive_p95_ms", "naive_miss_rate", budget_ms, top, x_domain,
                            "Naive gateway view (what a normal dashboard shows)")
    truth = _p95_and_misses(df, "p95_ms", "miss_rate", budget_ms, top, x_domain,
                            "Truthful view (what users hear)")
    return naive, truth


def _p95_and_misses(df, p95: str, misses: str, budget_ms: float, top: float, x_domain,
                    title: str) -> alt.Chart:
    data = _columns(df, ["t", p95, misses]).rename(columns={p95: "p95", misses: "misses"})
    # A censored p95 ("> budget") is drawn at the top of the axis, in red, never on the line.
    censored = [pd.notna(x) and math.isinf(float(x)) for x in data.p95]
    data = data.assign(
        shown=[top * 0.95 if c else x for c, x in zip(censored, data.p95)],
        value=["> budget (censored)" if c else ("—" if pd.isna(x) else f"{float(x):.1f} ms")
               for c, x in zip(censored, data.p95)],
        censored=censored)
    base = alt.Chart(data).encode(_time(x_domain))
    latency = base.mark_line(point=True).encode(
        alt.Y("shown:Q", title="p95 latency (ms)", scale=alt.Scale(domain=[0, top], clamp=True)),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), alt.Tooltip("value:N", title="p95")])
    band = _missed_band(top * 0.9, top) if any(censored) else ()
    budget = pd.DataFrame({"label": [f"budget {budget_ms:g} ms"], "ms": [float(budget_ms)]})
    miss = base.mark_bar(color="darkorange").encode(
        alt.Y("misses:Q", title="deadline misses", scale=alt.Scale(domain=[0, 1]),
              axis=alt.Axis(format="%")),
        tooltip=[alt.Tooltip("t:Q", title="t (s)"), alt.Tooltip("misses:Q", format=".1%")])
    return alt.vconcat(alt.layer(latency, *band, *_rules(budget, "ms")).properties(height=160),
                       miss.properties(height=100), title=title)


def limit_chart(ticks: pd.DataFrame, converged: int | None, x_domain=None) -> alt.Chart:
    """N* discovery: the admission cap and the live sessions over a ramp, with the cap the
    controller converged to marked."""
    lines = sessions_chart(ticks, x_domain)
    if converged is None:
        return lines.properties(title="Admission cap (N* discovery)")
    mark = pd.DataFrame({"label": [f"N* = {converged}"], "n": [converged]})
    return alt.layer(lines, *_rules(mark, "n")).properties(title="Admission cap (N* discovery)")


def collapse_chart(table: pd.DataFrame) -> alt.Chart:
    """Stalled runs out of n per policy (the paper's 14/20 vs 0/20)."""
    data = _columns(table, ["policy", "stalled", "runs"])
    return alt.Chart(data).mark_bar().encode(
        alt.X("policy:N", title=None),
        alt.Y("stalled:Q", title="runs that stalled", scale=alt.Scale(domainMin=0)),
        tooltip=["policy:N", "stalled:Q", "runs:Q"],
    ).properties(title="Collapse: stalled runs per policy")


def _finite(df: pd.DataFrame, column: str) -> list[float]:
    if df.empty or column not in df:
        return []
    return [float(x) for x in df[column].dropna() if math.isfinite(float(x))]


def _columns(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The chart's columns only; an empty frame may lack them all."""
    if df.empty:
        return pd.DataFrame(columns=columns)
    return df[columns]


def _melt(df: pd.DataFrame, value_columns: list[str], var: str, value: str) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=["t", var, value])
    return df.melt(id_vars=["t"], value_vars=value_columns, var_name=var, value_name=value)
