"""The load client's record: each frame it sent, what came back and when, as a run in the store
(`runs`, `frames` with origin "client", `events`), so the console reads a server Metronome does
not run like one it does.

A client frame's truth, on the client's clock (time.perf_counter, run-relative seconds):
    t_submit   when the append completing the frame's audio was sent
    t_first    the frame's first delta;  t_done: the delta that brought its last token
    latency_ms to the last delta (None unless every token came: censored otherwise)
    silent     no token came: `empty` (the server said so) or `missing` (no answer at all,
               e.g. the connection ended first)
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ClientFrame:
    session_id: int
    frame_idx: int
    t_sent: float
    t_first: float | None = None
    t_last: float | None = None
    tokens: int = 0
    done: dict | None = None  # the server's truth from response.done (its `metronome` part)


@dataclass
class ClientRecord:
    run_id: str
    url: str
    budget_ms: float
    tokens_expected: int
    t0: float = field(default_factory=time.perf_counter)
    frames: dict = field(default_factory=dict)  # (session, idx) → ClientFrame
    events: list = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def sent(self, sid: int, idx: int) -> None:
        self.frames[(sid, idx)] = ClientFrame(sid, idx, self.now())

    def delta(self, sid: int, idx: int | None, n: int) -> None:
        if idx is None:  # a server without per-frame markers: the latest frame sent
            idx = max((i for s, i in self.frames if s == sid), default=None)
        frame = self.frames.get((sid, idx))
        if frame is None:
            self.counts["stray_deltas"] += 1
            return
        t = self.now()
        frame.t_first = t if frame.t_first is None else frame.t_first
        frame.t_last = t
        frame.tokens += n

    def done(self, sid: int, idx: int | None, truth: dict) -> None:
        frame = self.frames.get((sid, idx))
        if frame is not None:
            frame.done = truth

    def event(self, kind: str, **detail) -> None:
        self.counts[kind] += 1
        self.events.append({"run_id": self.run_id, "t": self.now(),
                            "wall_at": dt.datetime.now(), "kind": kind,
                            "detail": json.dumps(detail, default=str)})

    # --- rows ---------------------------------------------------------------------------------
    def frame_rows(self) -> list[dict]:
        budget_s = self.budget_ms / 1e3
        rows = []
        for f in sorted(self.frames.values(), key=lambda f: (f.session_id, f.frame_idx)):
            complete = f.tokens >= self.tokens_expected
            latency = (f.t_last - f.t_sent) * 1e3 if complete else None
            silent = f.tokens == 0
            cause = None if not silent else ("missing" if f.done is None else "empty")
            rows.append({
                "run_id": self.run_id, "session_id": f.session_id, "frame_idx": f.frame_idx,
                "t_submit": f.t_sent, "deadline": f.t_sent + budget_s, "t_first": f.t_first,
                "t_done": f.t_last if complete else None, "latency_ms": latency,
                "latency_bound_ms": latency if complete else self.budget_ms,
                "censored": not complete, "tokens_out": f.tokens,
                "tokens_expected": self.tokens_expected, "silent": silent, "skipped": False,
                "complete": complete, "on_time": complete and latency <= self.budget_ms,
                "silent_cause": cause, "origin": "client"})
        return rows

    def summary(self, status: str, reason: str | None, offered: int, duration_s: float) -> dict:
        rows = self.frame_rows()
        firsts = [(r["t_first"] - r["t_submit"]) * 1e3 for r in rows if r["t_first"] is not None]
        lasts = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]

        def pct(values, q):
            return round(float(np.percentile(values, q)), 3) if values else None

        return {
            "run_id": self.run_id, "status": status, "reason": reason, "url": self.url,
            "duration_s": duration_s, "sessions_offered": offered,
            "admitted": self.counts["open"], "rejected": self.counts["reject"],
            "disconnected": self.counts["close"], "frames": len(rows),
            "frames_answered": sum(not r["silent"] for r in rows),
            "silent_frames": sum(r["silent"] for r in rows),
            "empty_frames": sum(r["silent_cause"] == "empty" for r in rows),
            "missing_frames": sum(r["silent_cause"] == "missing" for r in rows),
            "on_time_rate": round(sum(r["on_time"] for r in rows) / len(rows), 4) if rows
            else None,
            "first_delta_p50_ms": pct(firsts, 50), "first_delta_p95_ms": pct(firsts, 95),
            "last_delta_p50_ms": pct(lasts, 50), "last_delta_p95_ms": pct(lasts, 95),
            "last_delta_p99_ms": pct(lasts, 99), "budget_ms": self.budget_ms,
            "errors": {k[6:]: n for k, n in self.counts.items() if k.startswith("error:")},
            "stray_deltas": self.counts["stray_deltas"]}

    def write(self, store, settings: dict, summary: dict, started_at: dt.datetime) -> None:
        """The run, its frames and events, in one flush."""
        row = {"run_id": self.run_id, "started_at": started_at, "ended_at": dt.datetime.now(),
               "status": summary["status"], "reason": summary["reason"], "engine": "remote",
               "simulated": None, "model": self.url, "frame_ms": settings["frame_ms"],
               "budget_ms": self.budget_ms, "tokens_out": self.tokens_expected,
               "load": settings["load"], "sessions": settings["sessions"],
               "arrival_rate": settings.get("arrival_rate"), "duration_s": settings["duration_s"],
               "seed": settings["seed"], "admission": "remote",
               "settings": json.dumps(settings, default=str),
               "summary": json.dumps(summary, default=str)}
        store.writer.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES "
                             f"({', '.join('?' for _ in row)})", list(row.values()))
        store.writer.add_many("frames", self.frame_rows())
        store.writer.add_many("events", self.events)
        store.writer.flush(60.0)
