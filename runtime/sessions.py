"""Session lifecycle: open on an admitted arrival (an `open` event says its origin), one frame
per period, rollover before max_model_len, close (ended, source ended, error, evicted).

A session's source advances every period whether or not the engine keeps up (speech does not
wait): a frame the engine cannot take yet is skipped (silent), see runtime/backlog.py.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass

from control.admission import Ticket
from engine.contract import Engine, FrameHandle
from load_gen import make_frame_source
from runtime.backlog import count_new, may_submit, owed
from runtime.config import RunConfig
from runtime.history import RolloverHistory
from runtime.in_flight import InFlight
from runtime.opens import OpenBudget
from runtime.pools import TickCounts
from runtime.reasons import QUIET_CLOSES, Close
from runtime.record import Recorder
from runtime.remote import ORIGIN

logger = logging.getLogger(__name__)


@dataclass
class Session:
    session_id: int
    ticket: Ticket
    start: float  # run-relative seconds of its first frame
    end: float
    frames: object  # a load_gen frame source
    history: RolloverHistory  # its first S and last W inputs (the rollover prompt); bounded
    kv_tokens: int = 0  # tokens the engine holds for it (grows by in + out − 1 per frame)
    frame_idx: int = 0
    inflight: FrameHandle | None = None
    record: tuple | None = None  # (frame_idx, handle) awaiting finalisation
    tokens_seen: int = 0  # tokens of the in-flight handle already counted in a tick
    ahead: FrameHandle | None = None  # the frame still owed when `inflight` was queued behind
    ahead_seen: int = 0  # its tokens already counted in a tick (they count until it is done)
    max_blocks: int = 0
    rank: int | None = None  # data-parallel rank it lives on (None: the engine did not say)
    origin: str = "load"  # frames.origin: the run's load kind, or "gateway" for a client
    underruns: int = 0  # frame times a remote client still owed the audio


class Sessions:
    """The live sessions of one run and everything that happens to them."""

    def __init__(self, config: RunConfig, engine: Engine, recorder: Recorder, gate,
                 control, load, trace=None) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.gate = gate
        self.control = control  # WindowedLimit: sees every finalised frame's latency
        self._load = load
        self._trace = trace  # a replay load's (load_gen.trace_load.ReplayTrace)
        self._frame_s = config.frame_s
        self._budget_s = config.budget / 1e3
        self.live: dict[int, Session] = {}
        self.max_blocks_closed = 0
        self.tokens_unticked = 0  # tokens of replaced in-flight frames, for the next tick
        self._unticked_by_rank: dict = {}  # the same per rank
        self.opens = OpenBudget(config.open_budget, self._frame_s)
        self.in_flight = InFlight()  # what the store's writer waits out (runtime/in_flight.py)
        self.inlet = None  # runtime.remote.Inlet: told of its sessions' starves, submits, closes
        # An audio-in model takes each frame's audio through its encoder (engine contract).
        self._audio_in = engine.frame_token_ids is not None
        self.inputs_before = engine.input_stats()  # the encoder's counts as the run starts
        if self._audio_in and config.load == "replay":
            raise ValueError(f"load replay re-offers recorded token counts, not audio; model "
                             f"{config.model} takes audio through its encoder: use a load "
                             "with audio (wav, mic, gateway) or a synthetic one")

    # --- open ---------------------------------------------------------------------------------
    def open(self, session_id: int, ticket: Ticket, t_rel: float,
             rank: int | None = None, source=None, start: float | None = None,
             origin: str | None = None) -> float:
        """Open an admitted session, pinned to `rank` (None: the engine places it); returns the
        run-relative time of its first frame. A remote client brings its `source` and `start`
        (its own frame grid)."""
        cfg = self.config
        if start is None:
            if cfg.stagger:
                start = t_rel + (session_id % 8) / 8 * self._frame_s if cfg.load == "fixed" \
                    else t_rel
            else:
                start = math.ceil(t_rel / self._frame_s - 1e-9) * self._frame_s  # next tick
            # A burst of opens is spread over ticks (a remote client's start is its own).
            start = self.opens.place(start, [s.start for s in self.live.values()])
        end = start + cfg.session_s if cfg.session_s else math.inf
        if source is None:
            source = make_frame_source(self._load, session_id, self.engine.vocab_size,
                                       cfg.tokens_in, self._trace, audio=self._audio_in)
        history = RolloverHistory(self.history_tokens(), self.engine.policy.sink_tokens,
                                  self.engine.frame_token_ids)
        session = Session(session_id, ticket, start, end, source, history,
                          origin=origin or cfg.load)
        self.engine.open(session_id, rank)
        session.rank = self.engine.session_rank(session_id)
        self.live[session_id] = session
        self.recorder.event(t_rel, "open", session_id=session_id, origin=session.origin)
        return start

    # --- one frame ----------------------------------------------------------------------------
    def on_frame(self, session_id: int, t_rel: float) -> float | None:
        """The session's frame time: finalise the previous frame, submit this one. Returns the
        time of its next frame, or None when the session is gone."""
        cfg = self.config
        session = self.live.get(session_id)
        if session is None:
            return None
        now = self.engine.now()
        if session.origin == ORIGIN and session.record is not None:
            # A late remote frame keeps its full budget: the next waits until it is done
            # (looked at every T/8) or due, so a burst catches up (tests/gateway/test_catch_up).
            handle = session.record[1]
            due = handle.t_submit - self.recorder.t0 + self._budget_s
            if t_rel < due - 1e-9 and not handle.done_by(now):
                return min(due, t_rel + self._frame_s / 8)
        failed = session.inflight is not None and session.inflight.failed
        self._finalise(session, now)
        if failed:
            # One session's error ends that session only; the engine-wide case is caught at
            # the tick (engine.error()) and fails the run.
            self.close(session, t_rel, f"session error: {session.inflight.error}")
            return None
        if t_rel >= session.end - 1e-9:
            self.close(session, t_rel, Close.SESSION_ENDED)
            return None
        # The source advances every period, served or not: speech does not wait for the engine.
        frame = session.frames.next_frame(self._frame_s)
        if frame is None:
            self.close(session, t_rel, session.frames.end_reason or Close.SOURCE_ENDED)
            return None
        if not frame.token_ids:
            # A remote client owes the audio: the inlet runs this frame when it comes (late).
            session.underruns += 1
            return self.inlet.starved(session_id, t_rel)
        idx = session.frame_idx
        session.frame_idx += 1
        # From the start time, not by adding periods: no drift against the tick grid.
        next_at = session.start + session.frame_idx * self._frame_s
        if session.origin == ORIGIN and session.frames.backlog():
            next_at = min(next_at, t_rel + self._frame_s / 8)  # late audio came in a burst
        if not may_submit(session.inflight, session.ahead, now, cfg.tokens_out, self._budget_s):
            self._record(session, idx, t_rel, None, now)  # skipped: never submitted
            return next_at
        ahead = session.inflight if owed(session.inflight, now) else None  # queued behind it
        # An audio-in model's frame is its audio, and its ids are what the model's processor
        # makes of it (the load's stand-in ids are for text models).
        tokens, audio = (list(self.engine.frame_token_ids), [frame.audio]) if self._audio_in \
            else (frame.token_ids, None)
        prompt = tokens
        max_len = self.engine.max_model_len
        if max_len is not None and session.kv_tokens + len(tokens) + cfg.tokens_out >= max_len:
            if not self._rollover(session, t_rel):
                return None
            kept, kept_audio = session.history.prompt()
            prompt = kept + tokens
            audio = None if audio is None else kept_audio + audio
        session.history.add(tokens, frame.audio)
        new = self.new_tokens(session)
        self.tokens_unticked += new
        self._unticked_by_rank[session.rank] = self._unticked_by_rank.get(session.rank, 0) + new
        handle = self.engine.submit(session_id, prompt, cfg.tokens_out, audio=audio) \
            if audio else self.engine.submit(session_id, prompt, cfg.tokens_out)
        self.in_flight.add(handle)
        session.kv_tokens += len(prompt) + cfg.tokens_out - 1
        session.max_blocks = max(session.max_blocks, self._resident_blocks(session.kv_tokens))
        session.ahead, session.ahead_seen = ahead, session.tokens_seen if ahead else 0
        session.inflight, session.record, session.tokens_seen = handle, (idx, handle), 0
        if session.origin == ORIGIN:
            self.inlet.submitted(session_id, idx, handle, self)
        return next_at

    def _finalise(self, session: Session, now: float, keep_early: bool = True,
                  closing: str | None = None) -> None:
        if session.record is None:
            return
        idx, handle = session.record
        session.record = None
        if not keep_early and now < handle.t_submit + self._budget_s:
            return  # cut off by the run's end before its deadline: neither late nor silent
        self._record(session, idx, handle.t_submit - self.recorder.t0, handle, now, closing)

    def _record(self, session: Session, idx: int, t_sub_rel: float,
                handle: FrameHandle | None, now: float, closing: str | None = None) -> None:
        row = self.recorder.frame(session.session_id, idx, t_sub_rel, handle, now, closing,
                                  session.rank, session.origin)
        # A late frame's bound (≥ the budget) is over any target, so it counts in the p95; a
        # silent one counts there and in the silent share that makes a drop.
        self.control.add(now, row["latency_bound_ms"], row["silent"])

    # --- what a tick reads --------------------------------------------------------------------
    @staticmethod
    def new_tokens(session: Session) -> int:
        """Tokens of the in-flight frame (and the one it queued behind) no tick has counted."""
        new_ahead, session.ahead_seen = count_new(session.ahead, session.ahead_seen)
        new, session.tokens_seen = count_new(session.inflight, session.tokens_seen)
        return new_ahead + new

    def tick_counts(self, now: float) -> TickCounts:
        """Tokens out since the last tick and frames owed, in all and per rank: owed means
        submitted at least half a frame ago and not done (one submitted just now is not late)."""
        tokens, self.tokens_unticked = self.tokens_unticked, 0
        tokens_by_rank, self._unticked_by_rank = self._unticked_by_rank, {}
        n_owed, owed_by_rank = 0, {}
        for session in self.live.values():
            new = self.new_tokens(session)
            tokens += new
            tokens_by_rank[session.rank] = tokens_by_rank.get(session.rank, 0) + new
            handle = session.inflight
            if handle is not None and not handle.done_by(now) \
                    and handle.t_submit <= now - self._frame_s / 2:
                n_owed += 1
                owed_by_rank[session.rank] = owed_by_rank.get(session.rank, 0) + 1
        return TickCounts(tokens, n_owed, tokens_by_rank, owed_by_rank)

    def live_by_rank(self) -> dict:
        """Live sessions per rank (None: sessions whose rank the engine did not say)."""
        return dict(Counter(session.rank for session in self.live.values()))

    def max_resident_blocks(self) -> int:
        return max([self.max_blocks_closed] + [s.max_blocks for s in self.live.values()])

    # --- W and history ------------------------------------------------------------------------
    def history_tokens(self) -> int:
        """Input tokens a session keeps on the host for its rollover prompt: the live W."""
        policy = self.engine.policy
        return policy.window_tokens if policy.kind == "window" else self.config.tokens_in

    def follow_policy(self) -> None:
        """After a live W/S change: rollover prompts follow the new W; sinks only shrink."""
        for session in self.live.values():
            session.history.follow(self.history_tokens(), self.engine.policy.sink_tokens)

    def _resident_blocks(self, kv_tokens: int) -> int:
        bs = self.config.block_size
        cap = self.engine.policy.blocks_per_session(bs)
        blocks = math.ceil(kv_tokens / bs)
        return blocks if cap is None else min(blocks, cap)

    def _rollover(self, session: Session, t_rel: float) -> bool:
        """Before a session reaches max_model_len: reopen it with its last W tokens (window),
        or end it (unbounded has nothing to keep). Returns False when the session ended."""
        if self.engine.policy.kind != "window":
            self.close(session, t_rel, Close.MAX_MODEL_LEN)
            return False
        self.engine.close(session.session_id)
        self.engine.open(session.session_id, session.rank)  # a session keeps its rank
        session.kv_tokens = 0
        session.inflight = session.ahead = None
        self.recorder.totals.rollovers += 1
        kept, _ = session.history.prompt()
        self.recorder.event(t_rel, "rollover", session_id=session.session_id,
                            prompt_tokens=len(kept), sink_tokens=session.history.sink_tokens)
        return True

    # --- close --------------------------------------------------------------------------------
    def close(self, session: Session, t_rel: float, why: str) -> None:
        self._finalise(session, self.engine.now(), keep_early=why != Close.RUN_ENDED, closing=why)
        session.frames.close()  # e.g. releases a microphone stream now, not at garbage collection
        self.engine.close(session.session_id)
        self.live.pop(session.session_id, None)
        self.max_blocks_closed = max(self.max_blocks_closed, session.max_blocks)
        self.gate.release(session.ticket)
        if why not in QUIET_CLOSES:
            self.recorder.event(t_rel, "close", session_id=session.session_id, reason=why,
                                underruns=session.underruns)
        if self.inlet is not None:
            self.inlet.session_closed(session.session_id, why)

    def close_all(self, t_rel: float) -> None:
        for session in list(self.live.values()):
            try:
                self.close(session, t_rel, Close.RUN_ENDED)
            except Exception:  # noqa: BLE001 - keep closing the others
                logger.exception("closing session %s", session.session_id)

    def evict_largest(self, t_rel: float, rank: int | None = None) -> bool:
        """Stall guard: evict the session holding the most KV (frees the most blocks), on
        `rank` when given (only its pool is stalled). False when there was none to evict."""
        candidates = [s for s in self.live.values() if rank is None or s.rank == rank]
        if not candidates:
            return False
        victim = max(candidates, key=lambda s: (s.kv_tokens, -s.session_id))
        self.recorder.totals.evicted += 1
        self.recorder.event(t_rel, "evict", session_id=victim.session_id,
                            reason="stall guard: pool stalled, evicted the largest session",
                            kv_tokens=victim.kv_tokens, rank=victim.rank)
        self.close(victim, t_rel, Close.EVICTED)
        return True
