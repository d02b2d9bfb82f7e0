"""What a run did, in one sentence a non-engineer follows, generated from its summary JSON.

The stalled run's sentence says when it went silent, how silent it was after that (frames
submitted at or after the stall: whole seconds from the rollups, the rest from the frames
table), and what the gateway's dashboard showed
meanwhile; the bounded run's says where memory levelled and how many frames went silent.
"""

from __future__ import annotations

import json

from store import rollup_marks


def silent_after_stall(cur, summary: dict) -> float | None:
    """Share of frames submitted at or after the stall that went silent (None: no stall)."""
    if not summary.get("stalled") or summary.get("stall_at_s") is None:
        return None
    return rollup_marks.silent_share(cur, summary["run_id"], float(summary["stall_at_s"]))


def sentence(summary: dict, silent_after: float | None = None) -> str:
    naive = summary.get("naive_on_time_rate")
    dashboard = "" if naive is None else \
        f" while its dashboard still showed {naive:.0%} on time"
    silent = summary.get("silent_rate") or 0.0
    if summary.get("stalled"):
        after = "" if silent_after is None else \
            f" ({silent_after:.0%} of frames after that got no answer)"
        return (f"after {summary['stall_at_s']:.1f} s the engine went silent for every "
                f"session{after}{dashboard}")
    occupancy = f"{summary.get('max_occupancy') or 0.0:.2f}"
    if summary.get("policy") == "window":
        head = f"occupancy levelled at {occupancy} with W = {summary['window']}"
    else:
        head = f"unbounded: occupancy reached {occupancy} without a stall"
    if summary.get("silence") == "partial stall":
        return (f"{head}, but some sessions ran out of memory: {silent:.1%} of frames "
                f"silent{dashboard}")
    if not summary.get("silent_frames"):
        return f"{head}, no silent frame"
    why = " (too slow for this machine, not out of memory)" \
        if summary.get("silence") == "compute" else ""
    return f"{head}, {silent:.1%} of frames silent{why}{dashboard}"


def story(cur, cliff: dict, slope: dict) -> str:
    """The pair in one sentence: same load, unbounded then bounded."""
    return (f"Same {cliff['sessions_offered']} sessions on the same machine — unbounded KV: "
            f"{sentence(cliff, silent_after_stall(cur, cliff))}; bounded KV: "
            f"{sentence(slope, silent_after_stall(cur, slope))}.")


def row_sentence(cur, row: dict) -> str | None:
    """The sentence for a runs row (None while it has no summary)."""
    if not row.get("summary"):
        return None
    summary = json.loads(row["summary"])
    return sentence(summary, silent_after_stall(cur, summary))
