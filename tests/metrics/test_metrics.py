"""The metrics exporter: what a scrape carries after real (twin) runs, parsed by
prometheus_client's own parser, and how single rows are counted."""

from __future__ import annotations

import json
import math
import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metrics import MetricsExporter, frame_censored
from metrics.run_state import RunState, reason_label
from engine.twin import CostModel, TwinEngine
from runtime import RunConfig, Runner

LOAD = dict(engine="twin", pool_blocks=64, sessions=12, duration_s=10.0, frame_ms=80.0)

# Every metric the issue lists, by family name (the parser drops a counter's _total).
REQUIRED = ("metronome_frame_latency_seconds", "metronome_frames", "metronome_pool_occupancy_ratio",
            "metronome_pool_blocks", "metronome_tsat_seconds", "metronome_sessions_live",
            "metronome_admission_limit", "metronome_admission_decisions", "metronome_evictions",
            "metronome_stalls", "metronome_rollovers", "metronome_kv_window_tokens",
            "metronome_kv_sink_tokens", "metronome_tick_overrun_seconds",
            "metronome_store_rows_lost")


class _ScrapeAt:
    """An observer after the exporter: scrapes the registry once, mid-run, from the run thread
    (after the exporter has seen the same tick), so gauges of an active run are in the text."""

    def __init__(self, registry, at_s: float) -> None:
        self.registry, self.at_s, self.text = registry, at_s, None

    def observe(self, table, row):
        if table == "ticks" and self.text is None and row["t"] >= self.at_s:
            self.text = generate_latest(self.registry).decode()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(family, run_id, name=None, **labels):
    return [s for s in family.samples if s.labels.get("run_id") == run_id
            and (name is None or s.name == name)
            and all(s.labels.get(k) == v for k, v in labels.items())]


def _run(store, exporter, registry, config, at_s):
    scrape = _ScrapeAt(registry, at_s)
    runner = Runner(config, TwinEngine(config.engine_config(), CostModel()), store,
                    observers=[exporter, scrape])
    exporter.run_started_for(runner.run_id, config)
    summary = runner.run()
    exporter.run_ended(runner.run_id, summary)
    return summary, _families(scrape.text)


def test_two_runs_scrape_every_metric_with_counts_that_match_the_store(store):
    registry = CollectorRegistry()
    exporter = MetricsExporter()
    registry.register(exporter)
    exporter.track_store(store.writer)
    # Run 1, the cliff with admission and the stall guard: rejections, stalls, evictions.
    cliff_cfg = RunConfig(policy="unbounded", admission="aimd", stall_guard=True, **LOAD)
    cliff, mid = _run(store, exporter, registry, cliff_cfg, at_s=6.0)
    # Run 2, windowed with a short max_model_len: rollovers, a bounded W.
    slope_cfg = RunConfig(policy="window", window=64, sinks=32, max_model_len=512, **LOAD)
    slope, mid2 = _run(store, exporter, registry, slope_cfg, at_s=6.0)
    after = _families(generate_latest(registry).decode())

    for families in (mid, mid2):
        missing = [name for name in REQUIRED if name not in families]
        assert not missing, missing
    a, b = cliff["run_id"], slope["run_id"]
    lat = mid["metronome_frame_latency_seconds"]
    assert [s.labels["le"] for s in _samples(lat, a, "metronome_frame_latency_seconds_bucket")] \
        == ["0.005", "0.01", "0.02", "0.03", "0.04", "0.05", "0.06", "0.08", "0.1", "0.12",
            "0.16", "0.2", "0.3", "0.5", "1.0", "2.0", "+Inf"]
    # Mid-run, the cliff's gauges are there, labelled with its engine and model.
    occ = _samples(mid["metronome_pool_occupancy_ratio"], a)
    assert len(occ) == 1 and occ[0].labels["engine"] == "twin" and occ[0].labels["model"] == "tiny"
    assert 0 < occ[0].value <= 1
    blocks = {s.labels["state"]: s.value for s in _samples(mid["metronome_pool_blocks"], a)}
    assert blocks["used"] + blocks["free"] == 64
    assert _samples(mid["metronome_admission_limit"], a)[0].value >= 1
    assert _samples(mid["metronome_kv_window_tokens"], a)[0].value == math.inf
    window = _samples(mid2["metronome_kv_window_tokens"], b)[0].value
    assert window == 64 and _samples(mid2["metronome_kv_sink_tokens"], b)[0].value == 32
    assert _samples(mid["metronome_frame_budget_seconds"], a)[0].value == pytest.approx(0.08)

    # After both runs: counters equal the summaries; both runs' series coexist.
    frames = after["metronome_frames"]
    by_outcome = {s.labels["outcome"]: s.value
                  for s in _samples(frames, a, "metronome_frames_total")}
    assert sum(by_outcome.values()) == cliff["frames"]
    assert by_outcome["silent"] == cliff["silent_frames"] > 0
    assert by_outcome["on_time"] == round(cliff["on_time_rate"] * cliff["frames"])
    decisions = {(s.labels["decision"], s.labels["reason"]): s.value for s in
                 _samples(after["metronome_admission_decisions"], a,
                          "metronome_admission_decisions_total")}
    assert decisions[("admitted", "admitted")] == cliff["admitted"]
    assert decisions[("rejected", "over_limit")] == cliff["rejected"] > 0
    evicted = _samples(after["metronome_evictions"], a, "metronome_evictions_total")
    assert [(s.labels["reason"], s.value) for s in evicted] == [("stall_guard", cliff["evicted"])]
    assert _samples(after["metronome_stalls"], a, "metronome_stalls_total")[0].value >= 1
    assert _samples(after["metronome_rollovers"], b, "metronome_rollovers_total")[0].value \
        == slope["rollovers"] > 0
    overruns = _samples(after["metronome_tick_overrun_seconds"], a,
                        "metronome_tick_overrun_seconds_count")
    assert overruns[0].value == 125  # one per tick
    # Censored frames stay out of the histogram: count + censored = frames, and the censored
    # ones are exactly the store's incomplete frames.
    count = _samples(after["metronome_frame_latency_seconds"], a,
                     "metronome_frame_latency_seconds_count")[0].value
    censored = _samples(after["metronome_frames_censored"], a,
                        "metronome_frames_censored_total")[0].value
    store.writer.flush()
    incomplete = store.cursor().execute(
        "SELECT count(*) FROM frames WHERE run_id = ? AND NOT complete", [a]).fetchone()[0]
    assert censored == incomplete > 0 and count + censored == cliff["frames"]
    # An ended run keeps its counters but loses its gauges (its pool no longer exists).
    assert not _samples(after["metronome_pool_occupancy_ratio"], a)
    assert _samples(after["metronome_run_active"], a)[0].value == 0
    lost = after["metronome_store_rows_lost"].samples
    assert [(s.name, s.value) for s in lost] == [("metronome_store_rows_lost_total", 0.0)]
    written = after["metronome_store_rows_written"].samples[0].value
    assert written > cliff["frames"] + slope["frames"]


def test_censored_frames_follow_the_column_when_there_is_one():
    done = {"latency_ms": 30.0, "complete": True, "silent": False}
    assert not frame_censored(done)
    assert frame_censored({**done, "complete": False})  # latency is a lower bound
    assert frame_censored({**done, "latency_ms": None})
    assert frame_censored({**done, "censored": True})
    assert not frame_censored({**done, "complete": False, "censored": False})
    state = RunState("r")
    state.on_frame({**done, "censored": True, "t_submit": 1.0, "deadline": 1.08})
    state.on_frame({**done, "latency_ms": 45.0, "on_time": True})
    assert state.latency.cumulative()[4:6] == [("0.04", 0), ("0.05", 1)]  # 45 ms ≤ 50 ms
    assert state.censored == 1 and state.frames == {"on_time": 1, "late": 1, "silent": 0}
    assert state.budget_s == pytest.approx(0.08)


def test_a_bucket_bound_counts_as_le_and_tsat_none_is_never():
    state = RunState("r")
    state.on_frame({"latency_ms": 80.0, "complete": True})
    assert dict(state.latency.cumulative())["0.08"] == 1
    assert dict(state.latency.cumulative())["0.06"] == 0
    state.on_tick({"tsat_s": None, "overrun_ms": 0.0, "occupancy": 0.5})
    assert state.gauges["tsat_s"] == math.inf
    assert dict(state.overrun.cumulative())["0.001"] == 1


def test_stalls_are_counted_once_from_ticks_or_events():
    state = RunState("r")
    for stalled in (False, True, True, False, True):
        state.on_tick({"stalled": stalled})
    assert state.stalls == 2
    # A newer runner also emits a stall event per stall: still two, not four.
    state.on_event({"kind": "stall", "detail": "{}"})
    state.on_event({"kind": "stall", "detail": "{}"})
    assert state.stalls == 2
    state.on_event({"kind": "stall", "detail": "{}"})
    assert state.stalls == 3


def test_kv_gauges_follow_live_settings_and_tick_columns():
    # The live settings reach the exporter whole, as the run records them (a settings_history
    # row: LiveSettings.history_row), never parsed back from an event's text.
    exporter = MetricsExporter()
    exporter.observe("settings_history", {"run_id": "r", "setting": "policy",
                                          "policy": "window", "window_tokens": 256,
                                          "sink_tokens": 32})
    state = exporter._runs["r"]
    assert (state.window_tokens, state.sink_tokens) == (256, 32)
    state.on_event({"kind": "param_change", "detail": json.dumps(
        {"setting": "policy", "old": "window W=256 S=32", "new": "window W=64 S=0"})})
    assert state.window_tokens == 256  # an event counts a change; it does not set the gauges
    state.on_event({"kind": "param_rejected", "detail": json.dumps(
        {"setting": "policy", "new": "window W=64 S=0", "reason": "refused"})})
    assert state.param_changes == {("policy", "applied"): 1, ("policy", "rejected"): 1}
    state.on_settings({"policy": "unbounded", "window_tokens": None, "sink_tokens": 0})
    assert state.window_tokens == math.inf
    state.on_tick({"window_tokens": 128, "sink_tokens": 0})
    assert (state.window_tokens, state.sink_tokens) == (128, 0)
    state.on_tick({"window_tokens": None, "sink_tokens": None})
    assert state.window_tokens == math.inf


def test_reasons_become_bounded_labels():
    assert reason_label("stall guard: pool stalled, evicted the largest session") == "stall_guard"
    assert reason_label("session error: RuntimeError: x") == "session_error"
    assert reason_label(None) == "unknown" and reason_label("over_limit") == "over_limit"
    assert len(reason_label("x" * 500)) == 40


def test_only_a_few_ended_runs_are_kept():
    exporter = MetricsExporter(retained_ended_runs=2)
    for i in range(5):
        exporter.observe("frames", {"run_id": f"r{i}", "latency_ms": 1.0, "complete": True})
        exporter.observe("events", {"run_id": f"r{i}", "kind": "end", "detail": "{}"})
    exporter.observe("ticks", {"run_id": "live", "occupancy": 0.5})
    runs = {s.labels["run_id"] for f in exporter.collect() for s in f.samples if s.labels}
    assert runs == {"r3", "r4", "live"}
    with pytest.raises(ValueError, match="retained ended runs -1 must be in"):
        MetricsExporter(retained_ended_runs=-1)


class _Broken:
    def __init__(self):
        self.calls = 0

    def observe(self, table, row):
        self.calls += 1
        raise RuntimeError("metrics bug")


def test_a_failing_observer_is_dropped_and_the_run_goes_on(store, caplog):
    cfg = RunConfig(policy="window", window=64, **{**LOAD, "duration_s": 2.0})
    broken = _Broken()
    runner = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store, observers=[broken])
    summary = runner.run()
    assert summary["status"] == "finished" and summary["frames"] > 0
    assert broken.calls == 1
    assert sum("metrics bug" in r.getMessage() or "observer" in r.getMessage()
               for r in caplog.records) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_console_host_serves_its_runs_on_the_metrics_port(tmp_path):
    from services.run_host import RunHost
    from metrics import stop_serving

    port = _free_port()
    host = RunHost(metrics_port=port)
    try:
        assert host.metrics_endpoint == f"http://127.0.0.1:{port}/metrics"
        assert RunHost(metrics_port=port).metrics_endpoint == host.metrics_endpoint  # idempotent
        run_id = host.start(RunConfig(policy="window", window=64, **{**LOAD, "duration_s": 2.0}),
                            str(tmp_path / "m.duckdb"))
        deadline = time.monotonic() + 20
        while host.state().status in ("starting", "running", "stopping"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        text = urllib.request.urlopen(host.metrics_endpoint, timeout=5).read().decode()
        frames = _families(text)["metronome_frames"]
        assert sum(s.value for s in _samples(frames, run_id, "metronome_frames_total")) \
            == host.state().summary["frames"]
    finally:
        host.close()
        stop_serving(port)


def test_a_taken_port_leaves_the_console_without_metrics_not_broken():
    from services.run_host import RunHost

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        host = RunHost(metrics_port=s.getsockname()[1])
    assert host.metrics_endpoint.startswith("off: metrics address 127.0.0.1:")
    assert host._exporter is None


DEPLOY = __import__("pathlib").Path(__file__).resolve().parents[2] / "deploy"


def _deployed_exprs() -> list[str]:
    import yaml

    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((DEPLOY / "grafana" / "metronome.json").read_text())
    return exprs + [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_rules_and_dashboard_name_only_series_the_exporter_writes(store):
    """A misspelt name evaluates without error in Prometheus (to nothing): check the names."""
    import re

    registry = CollectorRegistry()
    exporter = MetricsExporter()
    registry.register(exporter)
    exporter.track_store(store.writer)
    cfg = RunConfig(policy="unbounded", admission="aimd", stall_guard=True, **LOAD)
    _, families = _run(store, exporter, registry, cfg, at_s=6.0)
    written = {s.name for f in families.values() for s in f.samples}
    used = {n for e in _deployed_exprs() for n in re.findall(r"\bmetronome_[a-z_]+", e)}
    assert used and not used - written, sorted(used - written)


def test_the_dashboard_imports_as_is_with_a_prometheus_datasource_variable():
    dashboard = json.loads((DEPLOY / "grafana" / "metronome.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert dashboard["id"] is None and dashboard["uid"] == "metronome"  # no instance's ids
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"] and all(t["datasource"] == p["datasource"] for t in p["targets"])
    titles = " ".join(p["title"] for p in panels)
    for needle in ("Frame latency vs budget", "Pool occupancy", "t_sat", "Silent frames",
                   "Admission", "vLLM KV cache usage", "vLLM requests running / waiting",
                   "vLLM preemptions"):
        assert needle in titles, needle


def test_a_bad_metrics_port_setting_is_named_and_the_console_runs_without(monkeypatch):
    from services.run_host import RunHost

    monkeypatch.setenv("METRONOME_METRICS_PORT", "nine")
    host = RunHost()
    assert host.metrics_endpoint == ("off: METRONOME_METRICS_PORT='nine' must be a port in "
                                     "[1, 65535], or 0 (off)")
    monkeypatch.setenv("METRONOME_METRICS_PORT", "0")
    assert RunHost().metrics_endpoint is None


def test_silent_frames_are_exported_by_cause_and_schedule_drift_by_schedule(store):
    import pandas as pd
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    exporter = MetricsExporter()
    registry.register(exporter)
    cfg = RunConfig(policy="unbounded", **LOAD)
    s = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store,
               observers=[exporter]).run()
    drift = pd.DataFrame([{"name": "nightly canary", "drifted": True, "n_star_change": -0.3,
                           "t_sat_change": float("nan")}])
    exporter.track_drift(lambda: drift)
    families = _families(generate_latest(registry).decode())
    causes = {x.labels["cause"]: x.value
              for x in _samples(families["metronome_silent_frames"], s["run_id"])}
    assert causes == {"memory": s["silent_memory_frames"]} and causes["memory"] > 0
    drifted = families["metronome_schedule_drifted"].samples
    assert [(x.labels["schedule"], x.value) for x in drifted] == [("nightly canary", 1.0)]
    change = families["metronome_schedule_n_star_change_ratio"].samples
    assert [x.value for x in change] == [-0.3]
    assert families["metronome_schedule_t_sat_change_ratio"].samples == []  # not measured


def test_n_star_is_exported_once_the_controller_held_a_stable_stretch(store):
    registry = CollectorRegistry()
    exporter = MetricsExporter()
    registry.register(exporter)
    config = RunConfig(engine="twin", policy="window", window=128, pool_blocks=4096,
                       load="ramp", sessions=180, arrival_rate=6.0, duration_s=30.0,
                       admission="aimd", target=0.5)
    early, late = _ScrapeAt(registry, 5.0), _ScrapeAt(registry, 29.0)  # climbing; settled
    runner = Runner(config, TwinEngine(config.engine_config(), CostModel()), store,
                    observers=[exporter, early, late])
    exporter.run_started_for(runner.run_id, config)
    summary = runner.run()
    assert not _samples(_families(early.text)["metronome_n_star_sessions"], runner.run_id)
    (sample,) = _samples(_families(late.text)["metronome_n_star_sessions"], runner.run_id)
    # What the run had found by the scrape (N* may still move by one in the last second).
    store.writer.flush()
    then = store.cursor().execute(
        "SELECT n_star FROM ticks WHERE run_id = ? AND t <= 29.0 ORDER BY t DESC LIMIT 1",
        [runner.run_id]).fetchone()[0]
    assert sample.value == then and abs(sample.value - 20) <= 2
    assert summary["n_star"] is not None and abs(summary["n_star"] - 20) <= 2
