"""Shared fixtures. vLLM logs go to stderr so captured stdout stays readable."""

import os

import pytest

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The console serves metrics on 9464 by default; tests that want it pass their own port.
os.environ.setdefault("METRONOME_METRICS_PORT", "0")


@pytest.fixture
def store(tmp_path):
    from store import Store

    s = Store(str(tmp_path / "test.duckdb"))
    yield s
    s.close()
