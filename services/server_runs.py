"""Runs of different servers on shared terms, without Streamlit.

A run recorded by the load client (`metronome load`, engine `remote`: gateway/client_record.py)
measured a server Metronome does not run, from the client's side; a run Metronome served
measured its own engine. Both have frames on one definition (a frame is answered when a token
came by its deadline, silent when none did: docs/GATEWAY.md, "What the load client measures"),
so two servers compare on what a listener hears: the per-frame latency, the silent share and
when silence happens. What each summary calls these differs (a client summary counts
`silent_frames`, a run's has `silent_rate`); `figures` reads both the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

REMOTE = "remote"  # runs.engine of a run the load client recorded
MAX_SESSIONS_DRAWN = 32  # the silence map's rows: a comparison draws once, but stays readable


@dataclass(frozen=True)
class Server:
    """Who answered a run's frames, as far as its record tells."""

    name: str  # "vLLM /v1/realtime", "Metronome gateway", "Metronome (vllm engine)", …
    url: str | None  # where the client connected (None: Metronome served the run itself)
    protocol: str | None  # the dialect spoken (client runs)
    frame_mapping: str | None  # how deltas found frames (client runs)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a server needs a name")

    def text(self) -> str:
        parts = [self.name]
        if self.protocol:
            parts.append(f"protocol {self.protocol}")
        if self.frame_mapping:
            parts.append(f"deltas by {self.frame_mapping}")
        if self.url:
            parts.append(self.url)
        return " · ".join(parts)


def is_remote(row: dict) -> bool:
    return row.get("engine") == REMOTE


def _json(text) -> dict:
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def server_of(row: dict) -> Server:
    """The server of a runs row: for a client run, named from what the client heard (vLLM's
    dialect; Metronome's frame markers; else an OpenAI-style server), never from the URL."""
    if not is_remote(row):
        engine = "twin, simulated" if row.get("simulated") else f"{row.get('engine')} engine"
        return Server(f"Metronome ({engine})", None, None, None)
    settings, summary = _json(row.get("settings")), _json(row.get("summary"))
    protocol = summary.get("protocol") or settings.get("protocol_spoken") \
        or settings.get("protocol")
    mapping = summary.get("frame_mapping") or settings.get("frame_mapping")
    if protocol == "vllm":
        name = "vLLM /v1/realtime"
    elif mapping == "server frame_idx":
        name = "Metronome gateway"  # only Metronome marks each delta with its frame
    else:
        name = "realtime server"
    return Server(name, summary.get("url") or row.get("model"), protocol, mapping)


def server_text(row: dict) -> str:
    return server_of(row).text()


def figures(row: dict) -> dict:
    """The figures two servers compare on, from either kind of summary: frames, silent share,
    on-time share, p95 of the frames answered (a client run; "> budget" never applies there,
    silent frames are counted apart), unmapped deltas (a client run)."""
    summary = _json(row.get("summary"))
    frames = summary.get("frames") or 0
    silent = summary.get("silent_frames")
    share = summary.get("silent_rate")
    if share is None and silent is not None and frames:
        share = silent / frames
    if is_remote(row):
        p95 = summary.get("last_delta_p95_ms")
        p95_text = "—" if p95 is None else f"{p95:.0f} ms (answered frames)"
    else:
        p95 = summary.get("p95_ms")
        p95_text = f"> {summary.get('budget_ms', 0):g} ms" if summary.get("p95_censored") \
            else "—" if p95 is None else f"{p95:.0f} ms"
    return {"frames": frames, "silent_frames": silent, "silent_share": share,
            "on_time_rate": summary.get("on_time_rate"), "p95": p95_text,
            "deltas_unmapped": summary.get("stray_deltas") if is_remote(row) else None}


def headline(row: dict) -> str:
    f = figures(row)
    share = "—" if f["silent_share"] is None else f"{f['silent_share']:.1%}"
    on_time = "—" if f["on_time_rate"] is None else f"{f['on_time_rate']:.1%}"
    tail = "" if not f["deltas_unmapped"] else \
        f" · {f['deltas_unmapped']} deltas after the last frame's deadline or unmapped"
    return (f"{row['sessions']} sessions · {f['frames']} frames · silent {share} · on time "
            f"{on_time} · p95 {f['p95']}{tail}")


def silent_share_buckets(frames: pd.DataFrame, bucket_s: float) -> pd.DataFrame:
    """Per time bucket of live_data's frame buckets (`bucket_s` wide): the share of frames
    that went silent."""
    if frames.empty:
        return pd.DataFrame(columns=["t", "t_end", "silent_share", "frames"])
    silent = frames.silent_per_s * bucket_s
    return pd.DataFrame({"t": frames.t, "t_end": frames.t + bucket_s,
                         "silent_share": (silent / frames.frames).where(frames.frames > 0),
                         "frames": frames.frames})


def time_span(duration_s: float, frames: pd.DataFrame, bucket_s: float) -> float:
    """Where a run's time axis ends: its duration, or the end of its last bucket when frames
    went on past it (a client's last append leaves a little after its due time)."""
    last = float(frames.t.max()) + bucket_s if not frames.empty else 0.0
    return max(float(duration_s), last)


def silence_map(wall: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The session wall's rows (session, time bucket, silent share) for a chart, at most
    MAX_SESSIONS_DRAWN sessions; the note says when some were left out."""
    if wall.empty:
        return wall, None
    sessions = sorted(wall.session_id.unique())
    kept = sessions[:MAX_SESSIONS_DRAWN]
    note = None if len(kept) == len(sessions) else \
        f"the first {len(kept)} of {len(sessions)} sessions"
    out = wall[wall.session_id.isin(kept)][["session_id", "t", "t_end", "silent_share",
                                            "frames"]]
    return out.reset_index(drop=True), note
