"""On real vLLM one scrape carries our metronome_* series and vLLM's own vllm:* series, unrenamed
(vLLM's PrometheusStatLogger registers them in this process's default registry)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metrics import default_exporter, serve, stop_serving
from runtime import RunConfig, Runner

pytestmark = pytest.mark.vllm

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "metronome.json"


def _dashboard_vllm_names() -> set[str]:
    """The vllm: series the dashboard's panels read, as family names (no _total)."""
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
             for t in p.get("targets", [])]
    return {re.sub(r"_total$", "", n) for e in exprs for n in re.findall(r"vllm:[a-z_]+", e)}


def test_a_vllm_run_scrape_has_vllm_series_next_to_ours(store, vllm_engines):
    # A pool no other module asks for: an engine of its own, started here. vLLM's Prometheus
    # series belong to the engine a process started last (each new stat logger takes the
    # names over), so a kept engine started earlier would scrape as an idle pool.
    config = RunConfig(engine="vllm", policy="window", window=128, pool_blocks=72, sessions=4,
                       frame_ms=160.0, duration_s=4.0)
    port = serve(0)
    engine = vllm_engines.get(config)  # vLLM registered its series when it started
    try:
        exporter = default_exporter()
        runner = Runner(config, engine, store, observers=[exporter])
        exporter.run_started_for(runner.run_id, config)
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        usage, families = [], {}
        while thread.is_alive():  # scrape as Prometheus would, every half second
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            families = {f.name: f for f in text_string_to_metric_families(text.decode())}
            usage += [s.value for s in families.get("vllm:kv_cache_usage_perc", ()).samples]
            time.sleep(0.5)
        thread.join()
    finally:
        stop_serving(port)
    assert runner.summary.status == "finished" and runner.summary.frames > 0
    wanted = _dashboard_vllm_names()
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:num_preemptions"} <= wanted
    missing = [name for name in sorted(wanted) if name not in families]
    assert not missing, (missing, sorted(families)[:40])
    assert max(usage) > 0  # vLLM's own view of the pool moved while our run ran
    frames = families["metronome_frames"].samples
    ours = [s for s in frames if s.labels.get("run_id") == runner.run_id]
    assert ours and ours[0].labels["engine"] == "vllm"
    running = families["vllm:num_requests_running"].samples
    assert running and "model_name" in running[0].labels
