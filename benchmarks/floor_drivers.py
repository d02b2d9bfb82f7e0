"""The drivers of benchmarks/frame_floor.py and benchmarks/floor_capacity.py, on one engine.

- `raw_frames`: vLLM's own async API alone: N streaming-input requests (the API Metronome
  drives), each appending `tokens_in` tokens every frame period (due at the phase Metronome
  gives its sessions, `phase_s`) and waiting for `tokens_out`,
  driven by a bare asyncio loop on the engine's thread: no run loop, no store, no ticks (each
  chunk is noted to the engine's step probe, a lock and an add, so StepTap counts its steps).
- `metronome_frames`: the same load through `Runner`, with suspects switched off by `mode`
  (MODES) so each one's share is measured, not guessed:
    full     the product as it runs (sessions, recorder, telemetry, the DuckDB writer)
    nostore  the writer drops bulk rows (frames, ticks, events, steps) before its queue: no
             DataFrames, no DuckDB while the run runs (run rows still go through)
    notick   the tick does nothing (no telemetry, control sample, tick row)
    bare     nostore and notick: what is left is the run thread's frame path itself
    perrow   full, with each row put on the writer's queue as it comes (Recorder.hold off: the
             recorder before 2026-12-07's seventh session, a writer wake per row)
    db1      full, with the database's DuckDB on one thread (`SET threads = 1` for the run):
             whether DuckDB's own worker threads, not its work, cost the engine's processes
             (the same as full where store.db_threads is already 1; METRONOME_DB_THREADS=2
             gives full DuckDB's default on two cores)

Frame latency is submission to the last token (`frames.latency_ms`); a frame with no answer
by its finalisation, or never submitted, is +inf. Latencies are taken from an observer of the
recorder's rows, so every mode reads them the same way.
"""

from __future__ import annotations

import asyncio
import math
import time

MODES = ("full", "nostore", "notick", "bare", "db1", "perrow")
_BULK = frozenset({"frames", "ticks", "events", "steps", "rank_ticks"})


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile; inf (a frame never answered) sorts last; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _raw_session(llm, sid: int, frames: int, period_s: float, t0: float,
                       tokens_in: int, tokens_out: int, vocab: int, out: list[float],
                       first: list[float], sent: dict | None = None, probe=None,
                       clock: str = "due", lags: list | None = None) -> None:
    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=tokens_out, min_tokens=tokens_out, ignore_eos=True,
                            temperature=0.0, output_kind=RequestOutputKind.DELTA)
    submitted: list[float] = []

    async def chunks():
        for k in range(frames):
            due = t0 + k * period_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            now = time.perf_counter()  # after the chunks the loop handled before this one
            submitted.append(due if clock == "due" else now)
            if lags is not None:
                lags.append((now - due) * 1e3)
            if sent is not None:
                sent.setdefault(k, []).append(now)
            if probe is not None:
                probe.note_handover(tokens_in)  # as Metronome's consumer does (StepTap)
            ids = [(sid * 7919 + k * tokens_in + j) % vocab for j in range(tokens_in)]
            yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=ids),
                                 sampling_params=params)

    done, first_seen = 0, False
    async for result in llm.generate(chunks(), params, f"raw-{sid}-{time.monotonic_ns()}"):
        completion = result.outputs[0] if result.outputs else None
        if completion is None:
            continue
        if completion.token_ids and not first_seen:
            first.append((time.perf_counter() - submitted[done]) * 1e3)
            first_seen = True
        if completion.finish_reason is not None:
            out.append((time.perf_counter() - submitted[done]) * 1e3)
            done, first_seen = done + 1, False
    out.extend([math.inf] * (frames - done))
    first.extend([math.inf] * (frames - len(first)))


PHASES = ("tick", "stagger", "1ms")
# Where a frame's latency starts. `due`: when the frame was due (its tick plus its session's
# phase), the same instant for both drivers, so what either puts between the tick and the
# engine counts. `submit`: where each driver stamps its own hand-over: Metronome's run thread
# before the hop to the engine's loop, raw on that loop once the chunks handled before its own
# are rendered; so raw's clock skips its wait behind the other sessions' chunks, Metronome's
# does not (the reading before 2026-12-07's seventh session).
CLOCKS = ("due", "submit")
RAW_GRACE_S = 10.0  # after a raw run's last frame was due: then what is unanswered is censored


def phase_s(phase: str, sid: int, frame_s: float) -> float:
    """When session `sid`'s frames are due within a period, as Metronome starts a fixed load
    that arrives at 0 (load_gen.trace_load.session_start, the runtime's rule): `tick` every
    session at the tick (RunConfig.stagger off), `stagger` phased over the period (on). `1ms`
    is the raw driver's old 1 ms per session, which no Metronome run matches (kept to measure
    what it did)."""
    from load_gen.trace_load import session_start

    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
    if phase == "1ms":
        return sid * 1e-3
    return session_start(0.0, sid, frame_s, phase == "stagger", "fixed")


def raw_frames(engine, sessions: int, frame_ms: float, duration_s: float, tokens_in: int,
               tokens_out: int, first: list[float] | None = None,
               sent: dict | None = None, phase: str = "tick",
               clock: str = "due", lags: list | None = None) -> list[float]:
    """Frame latencies in ms of `sessions` raw streaming requests on the engine's own loop,
    each session's frames due at its `phase` (phase_s), timed from when each was due (`clock`
    "due", CLOCKS); `first` (when given) gets each frame's first-token latency (inf: none),
    `lags` each frame's ms from due to the loop reaching its chunk."""
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r} is not one of {', '.join(CLOCKS)}")
    frames = int(duration_s * 1e3 / frame_ms)
    out: list[float] = []
    first = [] if first is None else first

    firsts: list[list[float]] = [[] for _ in range(sessions)]

    async def drive():
        t0 = time.perf_counter() + 0.05
        try:
            # Raw queues every chunk: over its capacity the backlog never drains, so the run
            # ends a grace after its last frame was due and what is unanswered is censored
            # (cancelling generate() aborts the requests).
            await asyncio.wait_for(asyncio.gather(*(
                _raw_session(engine._llm, sid, frames, frame_ms / 1e3,
                             t0 + phase_s(phase, sid, frame_ms / 1e3), tokens_in,
                             tokens_out, engine.vocab_size, out, firsts[sid], sent,
                             engine._probe, clock, lags)
                for sid in range(sessions))), timeout=duration_s + RAW_GRACE_S)
        except asyncio.TimeoutError:
            pass

    asyncio.run_coroutine_threadsafe(drive(), engine._loop).result(
        timeout=duration_s + RAW_GRACE_S + 60)
    out.extend([math.inf] * (sessions * frames - len(out)))
    for session_first in firsts:
        first.extend(session_first + [math.inf] * (frames - len(session_first)))
    return out


class StepTap:
    """The engine steps taken while a driver runs, whoever drains them (a Metronome run's tick
    drains them into its `steps` rows; raw and `notick` leave them to this tap):
    `with StepTap(engine) as tap: ...`, then `tap.steps` (engine.contract.StepStats).

    The engine's probe times a step that follows an idle engine from the hand-over of the work
    it does (`note_handover`, which Metronome's stream consumer calls for each chunk); a step
    with no hand-over noted is not recorded. So the raw driver notes its chunks the same way,
    or its first step after each idle gap (a period's first) would be missing from its count."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.steps: list = []

    def __enter__(self) -> "StepTap":
        self.engine.drain_step_stats()  # an earlier driver's last steps are not this one's
        drain = type(self.engine).drain_step_stats

        def tee():
            steps = drain(self.engine)
            self.steps.extend(steps)
            return steps

        self.engine.drain_step_stats = tee
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.drain_step_stats
        self.steps.extend(self.engine.drain_step_stats())

    def per_period(self, frame_ms: float, duration_s: float) -> dict:
        """Steps per frame period, the median step, the decoding requests per step, and the
        requests in a step that follows an idle engine (a period's first: those whose chunk
        reached the engine core before it started the step)."""
        periods = max(1.0, duration_s * 1e3 / frame_ms)
        busy = [s for s in self.steps if s.gen_tokens > 0]
        first = [s.gen_tokens for prev, s in zip(self.steps, self.steps[1:]) if prev.running == 0]
        return {"steps_per_period": len(self.steps) / periods,
                "first_step_requests": pct(first, 0.5),
                "step_ms_p50": pct([s.step_ms for s in self.steps], 0.5),
                "gen_per_step": (sum(s.gen_tokens for s in busy) / len(busy)) if busy
                else math.nan}


class _Latencies:
    """An observer: every frame row's latency (inf: censored or never submitted), from when
    the frame was due (`clock` due: its tick plus its session's phase) or from the run
    thread's submit (`clock` submit, the store's latency_ms); how many frames were skipped
    (never submitted: the engine still owed the session's previous frame, a rule raw does not
    have: it queues every chunk); and each submitted frame's lag from due to submit."""

    def __init__(self, config, clock: str = "due", sent: dict | None = None) -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock {clock!r} is not one of {', '.join(CLOCKS)}")
        self.frame_s, self.clock = config.frame_ms / 1e3, clock
        self.phase = "stagger" if config.stagger and config.load == "fixed" else "tick"
        self.ms: list[float] = []
        self.lag_ms: list[float] = []
        self.skipped = 0
        self.sent = {} if sent is None else sent  # frame index → its sessions' submissions

    def due(self, session_id: int, t_submit: float) -> float:
        """The run-relative time the frame submitted at `t_submit` was due: its session's
        phase on the tick grid (runtime/sessions.py; opens move a start by whole periods). A
        submit more than a period late would read as due on a later tick: the lag is under a
        millisecond in these runs."""
        phase = phase_s(self.phase, session_id, self.frame_s)
        return phase + math.floor((t_submit - phase) / self.frame_s + 1e-6) * self.frame_s

    def observe(self, table: str, row: dict) -> None:
        if table != "frames":
            return
        latency = row["latency_ms"]
        self.skipped += bool(row["skipped"])
        if row["skipped"]:
            self.ms.append(math.inf)
            return
        self.sent.setdefault(row["frame_idx"], []).append(row["t_submit"])
        lag_ms = (row["t_submit"] - self.due(row["session_id"], row["t_submit"])) * 1e3
        self.lag_ms.append(lag_ms)
        if latency is None:
            self.ms.append(math.inf)
        else:
            self.ms.append(latency + (lag_ms if self.clock == "due" else 0.0))


class _DroppingWriter:
    """The store's writer with bulk rows dropped before its queue (mode nostore)."""

    def __init__(self, writer) -> None:
        self._writer = writer
        self.dropped = 0

    def add(self, table: str, row: dict) -> None:
        self.add_many(table, [row])

    def add_many(self, table: str, rows: list[dict]) -> None:
        if table in _BULK:
            self.dropped += len(rows)
        else:
            self._writer.add_many(table, rows)

    def __getattr__(self, name):
        return getattr(self._writer, name)


class _StoreView:
    def __init__(self, store, writer) -> None:
        self._store, self.writer = store, writer

    def cursor(self):
        return self._store.cursor()


def metronome_frames(engine, config, store, mode: str = "full", sent: dict | None = None,
                     clock: str = "due", lags: list | None = None):
    """(frame latencies in ms, the run's RunSummary, the share of frames skipped) of a Runner
    run in `mode` (MODES), timed by `clock` (CLOCKS); `sent` (when given) gets each frame
    index's submission times, `lags` each submitted frame's ms from due to submit."""
    from runtime import Runner

    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    cls = Runner
    if mode in ("notick", "bare"):
        class _NoTick(Runner):
            def _on_tick(self, k: int, t_rel: float) -> None:
                pass
        cls = _NoTick
    view = store if mode in ("full", "notick", "db1", "perrow") else _StoreView(
        store, _DroppingWriter(store.writer))
    latencies = _Latencies(config, clock, sent)
    cur = store.cursor()
    (threads,) = cur.execute("SELECT current_setting('threads')").fetchone()
    if mode == "db1":
        cur.execute("SET threads = 1")  # the database instance's, every cursor's
    try:
        runner = cls(config, engine, view, observers=[latencies])
        if mode == "perrow":
            runner.recorder.hold = lambda on: None  # release() then finds nothing held
        summary = runner.run()
    finally:
        cur.execute(f"SET threads = {int(threads)}")  # the store's count (store.db_threads)
    if lags is not None:
        lags.extend(latencies.lag_ms)
    return latencies.ms, summary, latencies.skipped / max(1, len(latencies.ms))


def spread_ms(sent: dict[int, list[float]]) -> float:
    """Median over frame indices of the spread (last − first) of the sessions' submissions of
    that frame, in ms: how far apart frames due at one instant reach the engine (frames
    submitted by fewer than two sessions are left out)."""
    spreads = [(max(ts) - min(ts)) * 1e3 for ts in sent.values() if len(ts) > 1]
    return pct(spreads, 0.5)
