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
    # Every run that ended normally has exactly the frames its summary counts, minus the rows
    # the store reported lost (issue 12: nothing lost without a word).
    if s._closed:  # the test handed the file to another process: look at it afresh
        s = Store(s.path)
    s.writer.flush()
    mismatched = s.cursor().execute(
        """
        SELECT r.run_id, CAST(json_extract(r.summary, '$.frames') AS INTEGER) AS claimed,
               (SELECT count(*) FROM frames f WHERE f.run_id = r.run_id) AS stored,
               coalesce(CAST(json_extract(r.summary, '$.rows_lost') AS INTEGER), 0) AS lost
        FROM runs r WHERE r.status IN ('finished', 'aborted') AND r.summary IS NOT NULL
        """).df().query("claimed != stored and lost == 0")
    s.close()
    assert mismatched.empty, mismatched.to_dict("records")


@pytest.fixture(scope="session")
def vllm_engines():
    """vLLM engines shared across the session's modules (tests/vllm_machine.EnginePool)."""
    from tests.vllm_machine import EnginePool

    pool = EnginePool()
    yield pool
    # Each start is ~20-35 s of the suite: a count above the configurations asked for means
    # the pool evicted one that was needed again.
    _MEASURED.append(f"{pool.starts} vLLM engine start(s) in the shared pool")
    pool.close()


@pytest.fixture(scope="session")
def vllm_machine(vllm_engines):
    """This machine's vLLM speed, measured once per test session (tests/vllm_machine.py); the
    vLLM tests derive their frame period from it. Printed so a CI log says what it measured."""
    from tests.vllm_machine import measure

    machine = measure(vllm_engines)
    _MEASURED.append(f"N_c {machine.describe()} ({machine.cal.seconds:.0f} s to calibrate)")
    return machine


_MEASURED: list[str] = []  # what vllm_machine measured, for the summary at the end


def pytest_terminal_summary(terminalreporter) -> None:
    """The machine the vLLM tests ran on and what it served, at the end of the output (where a
    CI log's tail shows it): a failure reads differently on an AVX2 laptop and an AMX server."""
    if not _MEASURED:
        return
    from engine.dtype import cpu_model, flags_note, step_flags

    model = cpu_model() or "unknown CPU"
    wide = step_flags()
    terminalreporter.write_line(f"vLLM machine: {model}, {len(os.sched_getaffinity(0))} cores, "
                                f"{' '.join(wide) or 'no AVX2'}{flags_note()}; "
                                + "; ".join(_MEASURED))
