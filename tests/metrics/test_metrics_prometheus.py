"""A real Prometheus (Debian's package) scrapes a paced twin cliff run every second: the silent
frames rise, the pool reaches 1, the shipped stall alert fires, and every expression of the
shipped rules and dashboard evaluates on that server."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from metrics import default_exporter, serve, stop_serving
from runtime import RunConfig, Runner, make_engine

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "metronome.json"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="Debian's prometheus package is not installed (bash scripts/setup.sh test)")

# Grafana's variables, as "All" would expand them.
GRAFANA_VARS = {"$run_id": ".*", "$vllm_model": ".*", "$__rate_interval": "1m"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every rule and every dashboard target."""
    found = [(f"rule {r['alert']}", r["expr"])
             for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, (panel["title"], expr)
            found.append((f"panel {panel['title']!r} {target['refId']}", expr))
    return found


class _Prometheus:
    def __init__(self, tmp: Path, target_port: int) -> None:
        # The shipped rules with every `for:` cut to 0s, so a test-length stall fires them;
        # nothing else differs (checked in the test).
        rules = re.sub(r"(?m)^(\s*for:\s*)\S+$", r"\g<1>0s", RULES.read_text())
        (tmp / "alerts.yml").write_text(rules)
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "rule_files: [alerts.yml]\n"
            "scrape_configs:\n"
            "  - job_name: metronome\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp)
        self.log_path = tmp / "prometheus.log"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1)
                return
            except OSError:
                assert self.proc.poll() is None, self.log_path.read_text()[-2000:]
                assert time.monotonic() < deadline, "prometheus did not get ready in 30 s"
                time.sleep(0.2)

    def api(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def exporter_port():
    port = serve(0)
    yield port
    stop_serving(port)


def test_real_prometheus_sees_the_cliff_and_fires_the_stall_alert(store, tmp_path,
                                                                 exporter_port):
    t0 = time.monotonic()
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    prom = _Prometheus(tmp_path, exporter_port)
    # The paced cliff: 12 unbounded sessions fill a 256-block pool in ~3 s of wall time.
    config = RunConfig(engine="twin", paced=True, policy="unbounded", pool_blocks=256,
                       sessions=12, frame_ms=80.0, duration_s=40.0)
    deadline = time.monotonic() + 20
    while not prom.api("query", query='up{job="metronome"} == 1')["result"]:
        assert time.monotonic() < deadline, "prometheus never scraped the exporter"
        time.sleep(0.2)  # the first scrape must see the run from its empty pool
    exporter = default_exporter()
    exporter.track_store(store.writer)
    engine = make_engine(config)
    runner = Runner(config, engine, store, observers=[exporter])
    exporter.run_started_for(runner.run_id, config)
    run_id = runner.run_id
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        rules_copy = yaml.safe_load((tmp_path / "alerts.yml").read_text())
        shipped = yaml.safe_load(RULES.read_text())
        for g_copy, g in zip(rules_copy["groups"], shipped["groups"]):
            for r_copy, r in zip(g_copy["rules"], g["rules"]):
                assert r_copy["for"] == "0s"
                assert {**r_copy, "for": r["for"]} == r  # only `for:` differs

        firing, deadline = None, time.monotonic() + 30
        while firing is None:
            assert time.monotonic() < deadline, prom.api("alerts")
            alerts = prom.api("alerts")["alerts"]
            firing = next((a for a in alerts if a["labels"]["alertname"] == "MetronomeSilentStall"
                           and a["labels"].get("run_id") == run_id
                           and a["state"] == "firing"), None)
            time.sleep(0.5)
        stall_seen_s = time.monotonic() - t0
        assert "is stalled" in firing["annotations"]["summary"]
        assert firing["labels"]["severity"] == "critical" and firing["labels"]["engine"] == "twin"
        time.sleep(2)  # two more scrapes of the stalled run

        now = time.time()
        silent = prom.api("query_range", query=f'metronome_frames_total{{outcome="silent",'
                          f'run_id="{run_id}"}}', start=now - 60, end=now, step=1)["result"]
        values = [float(v) for _, v in silent[0]["values"]]
        assert values[0] == 0 < values[-1] and values == sorted(values), values
        occ = prom.api("query_range", query=f'metronome_pool_occupancy_ratio{{run_id="{run_id}"}}',
                       start=now - 60, end=now, step=1)["result"]
        rho = [float(v) for _, v in occ[0]["values"]]
        assert rho[0] < 0.5 and rho[-1] == 1.0 and rho == sorted(rho), rho
        # On the way up, t_sat fell under the warning threshold before the pool was full.
        soon = prom.api("query_range", query=f'ALERTS{{alertname="MetronomeSaturationSoon",'
                        f'alertstate="firing",run_id="{run_id}"}}',
                        start=now - 60, end=now, step=1)["result"]
        assert soon, "MetronomeSaturationSoon never fired"
        stalls = prom.api("query", query=f'metronome_stalls_total{{run_id="{run_id}"}}')["result"]
        assert float(stalls[0]["value"][1]) >= 1
        in_alerts = prom.api("query", query=f'ALERTS{{alertname="MetronomeSilentStall",'
                             f'alertstate="firing",run_id="{run_id}"}}')["result"]
        assert len(in_alerts) == 1

        # Every shipped expression parses and evaluates on this server.
        errors = []
        for where, expr in _expressions():
            try:
                prom.api("query", query=expr)
            except (AssertionError, OSError) as exc:
                errors.append(f"{where}: {exc}")
        assert not errors, errors
        # The dashboard's run picker (Grafana's label_values) finds the run.
        assert run_id in prom.api("label/run_id/values", **{"match[]": "metronome_run_active"})
        print(f"stall alert firing {stall_seen_s:.1f} s after the test started; "
              f"{len(values)} silent-frame samples {values[0]:.0f} → {values[-1]:.0f}; "
              f"occupancy samples {[round(r, 2) for r in rho]}; "
              f"{len(_expressions())} expressions evaluated")
    finally:
        runner.stop("test done")
        thread.join(30)
        engine.shutdown()
        prom.close()
