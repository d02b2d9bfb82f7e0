"""The load client's record: each frame it sent, what came back and when, as a run in the store
(`runs`, `frames` with origin "client", `events`), so the console reads a server Metronome does
not run like one it does. What it measures is defined in docs/GATEWAY.md ("What the load client
measures"); in short, on the client's clock (time.perf_counter, run-relative seconds):

    t_submit   when the append completing the frame's audio was sent
    a delta    goes to the frame the server names (`metronome.frame_idx`: mapping "server
               frame_idx"), else to the latest frame sent before it arrived ("latest frame
               sent"), and only while that frame's deadline (t_submit + budget) has not passed;
               a delta no frame can take is counted unmapped, with why
    t_first    the frame's first delta;  t_done: the delta that brought its `tokens_out`-th
               token (a server that does not say how many a frame owes: its first)
    latency_ms t_done − t_submit (None unless every token came: censored otherwise)
    silent     no delta: `empty` (the server's truth says so), `missing` (a server that marks
               frames sent no answer, e.g. the connection ended first), `no_delta` (a server
               without frame markers sent nothing the frame could take)
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from gateway.client_protocols import DELTA_EVENTS, SessionTerms

BY_SERVER = "server frame_idx"
BY_LATEST = "latest frame sent"


@dataclass
class ClientFrame:
    session_id: int
    frame_idx: int
    t_sent: float
    t_first: float | None = None
    t_last: float | None = None
    t_done: float | None = None  # when its tokens reached what a frame owes
    tokens: int = 0
    text: str = ""  # its deltas' strings, concatenated (what came back, to compare)
    done: dict | None = None  # the server's truth (metronome.frame, or an old response.done)


@dataclass
class SessionView:
    """One session's dialect as the record knows it; an undecided one may be told by its
    first delta."""

    protocol: str | None
    decided_by: str
    per_frame: bool
    latest: int | None = None  # the latest frame sent


@dataclass
class ClientRecord:
    run_id: str
    url: str
    budget_ms: float
    tokens_expected: int
    frame_ms: float | None = None  # the sessions' period (None: no session opened)
    t0: float = field(default_factory=time.perf_counter)
    frames: dict = field(default_factory=dict)  # (session, idx) → ClientFrame
    sessions: dict = field(default_factory=dict)  # session → SessionView
    events: list = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    server_events: Counter = field(default_factory=Counter)  # every event type received
    mapped: Counter = field(default_factory=Counter)  # deltas by mapping
    unmapped: Counter = field(default_factory=Counter)  # deltas no frame took, by why

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def open(self, sid: int, terms: SessionTerms) -> None:
        # One server per run: the last session's terms stand for all (they are the same).
        self.budget_ms, self.tokens_expected = terms.budget_ms, terms.tokens_out
        self.frame_ms = terms.frame_ms
        self.sessions[sid] = SessionView(terms.protocol, terms.decided_by, terms.per_frame)

    def sent(self, sid: int, idx: int) -> None:
        self.frames[(sid, idx)] = ClientFrame(sid, idx, self.now())
        if sid in self.sessions:
            self.sessions[sid].latest = idx

    def received(self, sid: int, kind: str) -> None:
        """Every server event: counted; a delta's name tells an undecided session's flavour,
        and one of another flavour than the session's is counted as a mismatch."""
        self.server_events[kind] += 1
        view, flavour = self.sessions.get(sid), DELTA_EVENTS.get(kind)
        if view is None or flavour is None:
            return
        if view.protocol is None:
            view.protocol, view.decided_by = flavour, f"first delta ({kind})"
        elif view.protocol != flavour:
            self.counts["protocol_mismatch"] += 1

    def delta(self, sid: int, idx: int | None, n: int, text: str = "") -> None:
        t = self.now()
        if idx is not None:
            frame = self.frames.get((sid, idx))
            why, how = "unknown frame_idx", BY_SERVER
        else:
            view = self.sessions.get(sid)
            latest = view.latest if view is not None else None
            frame = self.frames.get((sid, latest)) if latest is not None else None
            why, how = "before the first frame", BY_LATEST
            if frame is not None and t > frame.t_sent + self.budget_ms / 1e3:
                # Only possible once the audio stops (or with a budget under the period): no
                # frame sent since, and the latest one's deadline has passed.
                frame, why = None, "after the latest frame's deadline"
        if frame is None:
            self.unmapped[why] += 1
            return
        self.mapped[how] += 1
        frame.t_first = t if frame.t_first is None else frame.t_first
        frame.t_last = t
        frame.tokens += n
        frame.text += text
        if frame.t_done is None and frame.tokens >= self.tokens_expected:
            frame.t_done = t

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
    def _cause(self, f: ClientFrame) -> str:
        if f.done is not None:
            return "empty"
        view = self.sessions.get(f.session_id)
        return "missing" if view is None or view.per_frame else "no_delta"

    def frame_rows(self) -> list[dict]:
        budget_s = self.budget_ms / 1e3
        rows = []
        for f in sorted(self.frames.values(), key=lambda f: (f.session_id, f.frame_idx)):
            complete = f.t_done is not None
            latency = (f.t_done - f.t_sent) * 1e3 if complete else None
            silent = f.tokens == 0
            rows.append({
                "run_id": self.run_id, "session_id": f.session_id, "frame_idx": f.frame_idx,
                "t_submit": f.t_sent, "deadline": f.t_sent + budget_s, "t_first": f.t_first,
                "t_done": f.t_done, "latency_ms": latency,
                "latency_bound_ms": latency if complete else self.budget_ms,
                "censored": not complete, "tokens_out": f.tokens,
                "tokens_expected": self.tokens_expected, "silent": silent, "skipped": False,
                "complete": complete, "on_time": complete and latency <= self.budget_ms,
                "silent_cause": self._cause(f) if silent else None, "origin": "client"})
        return rows

    @staticmethod
    def _one(values) -> str | None:
        """The one value all share, "mixed" when they differ, None when there are none."""
        names = set(values)
        return None if not names else names.pop() if len(names) == 1 else "mixed"

    def protocol_summary(self) -> dict:
        """Which dialect was spoken and how each delta found its frame (never silently)."""
        views = list(self.sessions.values())
        return {
            "protocol": self._one(v.protocol or "undecided" for v in views),
            "protocol_sessions": dict(Counter(f"{v.protocol or 'undecided'} ({v.decided_by})"
                                              for v in views)),
            # The mapping the deltas used; with no delta, the one the sessions would have used.
            "frame_mapping": self._one(self.mapped) if self.mapped else
            self._one(BY_SERVER if v.per_frame else BY_LATEST for v in views),
            "deltas_mapped": dict(self.mapped), "deltas_unmapped": dict(self.unmapped),
            "protocol_mismatches": self.counts["protocol_mismatch"],
            "server_events": dict(self.server_events)}

    def summary(self, status: str, reason: str | None, offered: int, duration_s: float) -> dict:
        rows = self.frame_rows()
        firsts = [(r["t_first"] - r["t_submit"]) * 1e3 for r in rows if r["t_first"] is not None]
        lasts = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
        causes = Counter(r["silent_cause"] for r in rows if r["silent"])

        def pct(values, q):
            return round(float(np.percentile(values, q)), 3) if values else None

        return {
            "run_id": self.run_id, "status": status, "reason": reason, "url": self.url,
            **self.protocol_summary(),
            "duration_s": duration_s, "sessions_offered": offered,
            "admitted": self.counts["open"], "rejected": self.counts["reject"],
            "disconnected": self.counts["close"], "frames": len(rows),
            "frames_answered": sum(not r["silent"] for r in rows),
            "silent_frames": sum(r["silent"] for r in rows),
            "empty_frames": causes["empty"], "missing_frames": causes["missing"],
            "no_delta_frames": causes["no_delta"],
            "on_time_rate": round(sum(r["on_time"] for r in rows) / len(rows), 4) if rows
            else None,
            "first_delta_p50_ms": pct(firsts, 50), "first_delta_p95_ms": pct(firsts, 95),
            "last_delta_p50_ms": pct(lasts, 50), "last_delta_p95_ms": pct(lasts, 95),
            "last_delta_p99_ms": pct(lasts, 99), "budget_ms": self.budget_ms,
            "tokens_expected": self.tokens_expected,
            "errors": {k[6:]: n for k, n in self.counts.items() if k.startswith("error:")},
            "stray_deltas": sum(self.unmapped.values())}

    def write(self, store, settings: dict, summary: dict, started_at: dt.datetime) -> None:
        """The run, its frames and events, in one flush. `model` names the server's URL (the
        client does not know what runs behind it); the settings name the protocol asked and
        the one spoken."""
        settings = {**settings, "protocol_spoken": summary.get("protocol"),
                    "frame_mapping": summary.get("frame_mapping")}
        row = {"run_id": self.run_id, "started_at": started_at, "ended_at": dt.datetime.now(),
               "status": summary["status"], "reason": summary["reason"], "engine": "remote",
               "simulated": None, "model": self.url,
               "frame_ms": self.frame_ms or settings["frame_ms"],
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
