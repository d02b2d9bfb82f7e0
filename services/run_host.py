"""RunHost: owns the one run the console drives, outside any Streamlit script run.

Streamlit reruns the page script on every interaction and on every fragment tick, so a run
cannot live in a script run. The console keeps one RunHost per process (through
`st.cache_resource`); the host builds the engine and drives the Runner in its own thread, so the
page never waits on vLLM's ~20 s start, and the page only ever reads `state()`. Nothing here
imports Streamlit: the run thread must never call st.*, and the host stays testable on its own.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
import weakref
from dataclasses import dataclass

from runtime import LiveSettings, RunConfig, Runner, make_engine
from store import open_store
from store.schedules import latest_drift

logger = logging.getLogger(__name__)

ACTIVE = ("preparing", "starting", "running", "stopping")  # preparing: e.g. a calibration
def one_line(exc: BaseException) -> str:
    """The first line of an exception's message, for an operator-facing error."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _Stopped(Exception):
    """The host was stopped while it prepared a series."""


def new_run_id() -> str:
    """Same shape as the Runner's own ids (sortable by start time); made here so that `start`
    can return the id before the engine, and so the Runner, exists."""
    return f"{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class SeriesState:
    """An experiment's (or a calibration's) place in its runs."""

    kind: str
    run_ids: tuple[str, ...]
    total: int
    index: int  # the run under way (0-based)
    progress: float  # of the whole series, 0..1


@dataclass(frozen=True)
class HostState:
    """What the console reads of the host, taken at once under its lock."""

    status: str  # idle, preparing, starting, running, stopping, finished, aborted, failed
    run_id: str | None
    engine: str | None
    simulated: bool
    progress: float  # of the run under way, 0..1
    error: str | None
    summary: dict | None  # the run's summary once it ended
    config: RunConfig | None
    series: SeriesState | None
    note: tuple[float, str] | None  # (fraction, text) while preparing, else the last one


_HOSTS: weakref.WeakSet = weakref.WeakSet()  # the process's hosts (the console makes one)


def current_host() -> RunHost | None:
    """The host the console made in this process, if any (the gateway's routes, served by
    the same process, join its run)."""
    hosts = list(_HOSTS)
    return hosts[-1] if hosts else None


def serves_remote(config: RunConfig) -> bool:
    """Remote clients join runs in real time: vLLM, or the twin paced to the wall clock."""
    return config.engine != "twin" or config.paced


class RunHost:
    """One run (or one series of runs, for an experiment) at a time: start it, stop it, change
    it live, read its state from any thread. A run in real time also takes remote clients
    (the gateway's: `gateway_target`), admitted by its own gate."""

    def __init__(self, engine_factory=make_engine, metrics_port: int | None = None) -> None:
        """metrics_port: where Prometheus scrapes this process while it lives (None: from
        $METRONOME_METRICS_PORT, default 9464; 0: off)."""
        self._make_engine = engine_factory  # injectable so tests can fail an engine start
        self._exporter = None
        self.metrics_endpoint: str | None = None  # the URL served, or why none is
        self._serve_metrics(metrics_port)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._runner: Runner | None = None
        self._stop = threading.Event()
        self._status = "idle"
        self._run_id: str | None = None
        self._engine_kind: str | None = None
        self._error: str | None = None
        self._config: RunConfig | None = None
        self._series: dict | None = None  # {"kind", "run_ids", "total"} of an experiment
        self._note: tuple[float, str] | None = None  # (fraction, text) of a preparation
        self._target = None  # gateway.server.Target of the running run, when it takes clients
        _HOSTS.add(self)

    def _serve_metrics(self, port: int | None) -> None:
        # The console must come up even when the port is taken (a second console, a test run):
        # it logs why and runs without metrics.
        from metrics.server import serve_from_env

        self._exporter, self.metrics_endpoint = serve_from_env(port)

    def start(self, config: RunConfig, db_path: str | None = None) -> str:
        """Start `config` in the background and return its run id at once.

        Raises ValueError while another run (or its engine shutdown) is still in progress.
        """
        return self.start_series([config], db_path)[0]

    def start_series(self, configs: list[RunConfig], db_path: str | None = None,
                     kind: str | None = None) -> list[str]:
        """Run `configs` one after another in the background (an experiment); returns their run
        ids at once. Each run gets its own engine, shut down before the next one starts, so a
        series never holds two engines' memory. `kind` names the experiment in `state()`."""
        if not configs:
            raise ValueError("an experiment needs at least one run")
        return self._launch(None, list(configs), len(configs), db_path, kind)

    def start_prepared(self, prepare, total: int, db_path: str | None = None,
                       kind: str | None = None) -> list[str]:
        """Like start_series, but the configs come from `prepare(store, progress)`, called
        first on the host's thread (a calibration: a minute or two on vLLM, never on a page's
        thread). `progress(fraction, text)` shows in `state().note` and raises once the
        host is stopped. `total`: how many configs prepare returns (0: it is the whole job,
        e.g. a recalibration). Returns the run ids at once."""
        if not 0 <= total <= 1000:
            raise ValueError(f"prepared runs {total} must be in [0, 1000]")
        return self._launch(prepare, None, total, db_path, kind)

    def _launch(self, prepare, configs, total: int, db_path, kind) -> list[str]:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise ValueError(
                    f"run {self._run_id} is still {self._status_locked()}; stop it first")
            store = open_store(db_path)  # a StoreError surfaces to the caller, not the thread
            run_ids = [new_run_id() for _ in range(total)]
            self._stop.clear()
            self._runner = None
            first = configs[0] if configs else None
            self._status = "starting" if prepare is None else "preparing"
            self._run_id = run_ids[0] if run_ids else None
            self._engine_kind = first.engine if first else None
            self._error, self._config, self._note = None, first, None
            self._series = None if kind is None else {
                "kind": kind, "run_ids": run_ids, "total": total, "index": 0}
            target = self._work_series if prepare is None else self._work_prepared
            self._thread = threading.Thread(
                target=target, args=(prepare or configs, store, run_ids),
                name=f"metronome-host-{run_ids[0] if run_ids else kind}", daemon=True)
            self._thread.start()
        logger.info("%s: %d run(s)%s", kind or f"run {run_ids[0]}", total,
                    "" if prepare is None else " after preparing")
        return run_ids

    def apply(self, **change) -> str:
        """Change the running run's settings live (Runner.apply: validated now, applied at the
        next tick and recorded as an event). Raises ValueError with a one-line reason."""
        with self._lock:
            runner = self._runner
            status = self._status_locked()
        if runner is None or status != "running":
            raise ValueError("no run is running; start one on the Load page")
        return runner.apply(**change)

    def stop(self) -> None:
        """Ask the current run to end; a no-op when nothing runs. Does not wait."""
        with self._lock:
            self._stop.set()
            if self._runner is not None:
                self._runner.stop("stopped by operator")

    def close(self, timeout: float = 60.0) -> None:
        """Stop and wait for the engine to be shut down (the console's cache release)."""
        self.stop()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def live_settings(self) -> LiveSettings | None:
        """The settings the running run uses now (after live changes), None when none runs."""
        with self._lock:
            runner = self._runner
        return None if runner is None else runner.live_settings

    def gateway_target(self):
        """The running run's gateway Target (its inlet, what a session is told, the model's
        words), or None: nothing runs, or it runs in simulated time."""
        with self._lock:
            return self._target if self._status_locked() == "running" else None

    def state(self) -> HostState:
        with self._lock:
            runner = self._runner
            series = None
            if self._series is not None:
                raw = self._series
                done = raw["index"] + (runner.progress if runner is not None else 0.0)
                progress = min(1.0, done / raw["total"]) if raw["total"] \
                    else (self._note[0] if self._note else 0.0)  # a preparation alone
                series = SeriesState(raw["kind"], tuple(raw["run_ids"]), raw["total"],
                                     raw["index"], progress)
            return HostState(
                status=self._status_locked(), run_id=self._run_id, engine=self._engine_kind,
                simulated=self._engine_kind == "twin",
                progress=runner.progress if runner is not None else 0.0, error=self._error,
                summary=runner.summary if runner is not None else None, config=self._config,
                series=series, note=self._note)

    def _status_locked(self) -> str:
        if self._status in ("starting", "running") and self._stop.is_set():
            return "stopping"
        return self._status

    # --- the host thread ----------------------------------------------------------------------
    def _progress(self, fraction: float, text: str) -> None:
        if self._stop.is_set():
            raise _Stopped(text)
        with self._lock:
            self._note = (max(0.0, min(1.0, fraction)), text)

    def _work_prepared(self, prepare, store, run_ids: list[str]) -> None:
        try:
            configs = list(prepare(store, self._progress))
            if len(configs) != len(run_ids):
                raise ValueError(f"preparation gave {len(configs)} runs, not {len(run_ids)}")
        except _Stopped:
            self._finish(None, "aborted", None)
            return
        except Exception as exc:  # noqa: BLE001 - the operator reads why in the state
            logger.exception("preparation failed")
            self._finish(None, "failed", one_line(exc))
            return
        if not configs:
            self._finish(None, "finished", None)
            return
        with self._lock:
            if self._stop.is_set():
                self._status = "aborted"
                return
            self._status, self._engine_kind, self._config = (
                "starting", configs[0].engine, configs[0])
        self._work_series(configs, store, run_ids)

    def _work_series(self, configs: list[RunConfig], store, run_ids: list[str]) -> None:
        for index, (config, run_id) in enumerate(zip(configs, run_ids)):
            if index:
                with self._lock:
                    if self._stop.is_set():
                        self._status = "aborted"  # the series was stopped between its runs
                        return
                    self._runner = None
                    self._status, self._run_id, self._engine_kind, self._error = (
                        "starting", run_id, config.engine, None)
                    self._config = config
                    self._series["index"] = index
            self._work(config, store, run_id)
            if self._status == "failed":
                return  # a broken engine would fail every later run the same way

    def _work(self, config: RunConfig, store, run_id: str) -> None:
        try:
            engine = self._make_engine(config, store)
        except Exception as exc:  # noqa: BLE001 - any start failure is the operator's to read
            logger.exception("run %s: engine did not start", run_id)
            self._finish(run_id, "failed", f"engine did not start: {one_line(exc)}")
            return
        status, error = "aborted", None  # stays so when stopped while the engine was starting
        try:
            runner = self._begin(config, engine, store, run_id)
            if runner is not None:
                summary = runner.run()
                if self._exporter is not None:
                    self._exporter.run_ended(run_id, summary)
                status = summary["status"]
                error = summary["reason"] if status == "failed" else None
        except Exception as exc:  # noqa: BLE001 - e.g. the store writer timing out at the end
            logger.exception("run %s failed", run_id)
            status, error = "failed", one_line(exc)
        finally:
            # The status leaves ACTIVE only once the engine is down, so a new start never
            # overlaps the old engine's memory.
            with self._lock:
                self._status = "stopping"
            self._shutdown(engine)
            self._finish(run_id, status, error)

    def _begin(self, config: RunConfig, engine, store, run_id: str) -> Runner | None:
        codec = None
        if serves_remote(config):  # the model's tokenizer, read before the lock is taken
            from gateway.serve import text_codec

            codec = text_codec(engine)
        with self._lock:
            if self._stop.is_set():
                return None
            observers = []
            if self._exporter is not None:
                self._exporter.track_store(store.writer)
                self._exporter.track_drift(lambda: latest_drift(store.cursor()))
                self._exporter.run_started_for(run_id, config)
                observers.append(self._exporter)
            inlet, self._target = None, None  # no earlier run's clients join this one
            if serves_remote(config):
                from runtime.remote import Inlet

                inlet = Inlet(config, engine.vocab_size)
            self._runner = Runner(config, engine, store, run_id=run_id, observers=observers,
                                  inlet=inlet)
            if inlet is not None:
                from gateway.serve import session_info
                from gateway.server import Target

                self._target = Target(inlet, session_info(self._runner, inlet), codec)
            self._status = "running"
            return self._runner

    def _finish(self, run_id: str, status: str, error: str | None) -> None:
        with self._lock:
            self._status, self._error = status, error
        logger.info("run %s %s%s", run_id, status, f": {error}" if error else "")

    @staticmethod
    def _shutdown(engine) -> None:
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - a failed shutdown must not hide the run's result
            logger.exception("engine shutdown failed")
