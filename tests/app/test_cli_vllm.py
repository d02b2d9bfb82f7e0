"""End to end through the console script on real vLLM: run, refit the twin, run the twin."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


def _metronome(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_vllm_run_then_fit_twin_then_twin_run(tmp_path):
    db = str(tmp_path / "e2e.duckdb")
    real = _metronome("run", "--engine", "vllm", "--json", "--db", db, "--policy", "window",
                      "--window", "128", "--pool-blocks", "64", "--sessions", "6",
                      "--frame-ms", "160", "--duration", "4")
    assert real.returncode == 0, real.stderr[-3000:]
    summary = json.loads(real.stdout)  # stdout holds the JSON only, vLLM's logs went to stderr
    assert summary["engine"] == "vllm" and summary["simulated"] is False
    assert summary["frames"] > 0 and summary["status"] == "finished"

    fit = _metronome("fit-twin", summary["run_id"], "--db", db, "--json")
    assert fit.returncode == 0, fit.stderr[-2000:]
    model = json.loads(fit.stdout)
    assert model["source_run_id"] == summary["run_id"] and model["n_steps"] >= 20

    twin = _metronome("run", "--engine", "twin", "--json", "--db", db, "--policy", "window",
                      "--window", "128", "--pool-blocks", "64", "--sessions", "6",
                      "--frame-ms", "160", "--duration", "4")
    assert twin.returncode == 0, twin.stderr[-2000:]
    sim = json.loads(twin.stdout)
    assert sim["simulated"] is True and sim["twin_cost_source"] == summary["run_id"]

    refused = _metronome("fit-twin", sim["run_id"], "--db", db)
    assert refused.returncode == 2 and "is simulated" in refused.stderr
