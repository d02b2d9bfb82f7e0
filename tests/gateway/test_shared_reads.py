"""Readers while another process holds the database: `metronome runs`, `report` and
`schedule list` from another process read through the holder (serve here, the console in
tests/e2e: the same route), and see the run that is running; a writer is still refused with
one line; only SELECT goes through."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from store.shared_reads import checked_select, holder_file
from tests.gateway.conftest import ROOT

pytestmark = pytest.mark.slow


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def test_readers_read_through_serve_while_it_holds_the_database(serve, tmp_path):
    server = serve("--sessions", "2", duration=30)
    holder = json.loads(holder_file(str(server.db)).read_text())
    assert holder["pid"] == server.proc.pid and holder["token"] is None  # loopback: open
    listing = _cli("runs", "--db", str(server.db))
    assert listing.returncode == 0, listing.stderr
    assert "running" in listing.stdout  # the run serve is running, seen while it runs
    run_id = listing.stdout.splitlines()[1].split()[0]
    out = tmp_path / "report.html"
    report = _cli("report", run_id, "--db", str(server.db), "--out", str(out))
    assert report.returncode == 0, report.stderr
    assert run_id in out.read_text()
    schedules = _cli("schedule", "list", "--db", str(server.db))
    assert schedules.returncode == 0, schedules.stderr
    # A writer is refused, in one line naming the holder.
    writer = _cli("run", "--engine", "twin", "--duration", "1", "--db", str(server.db))
    assert writer.returncode != 0
    lines = [line for line in writer.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"in use by process {server.proc.pid}" in lines[0], lines
    # Only a SELECT goes through the holder's endpoint.
    request = urllib.request.Request(holder["url"], method="POST", data=json.dumps(
        {"sql": "DELETE FROM runs"}).encode(), headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400 and b"only one SELECT" in refused.value.read()
    server.proc.terminate()
    server.proc.wait(30)
    deadline = time.monotonic() + 5
    while holder_file(str(server.db)).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not holder_file(str(server.db)).exists()  # withdrawn at the end


@pytest.mark.parametrize("sql", ["DELETE FROM runs", "SELECT 1; DROP TABLE runs",
                                 "ATTACH 'x.db'", "", "SELEC 1"])
def test_only_one_select_is_read_through_the_holder(sql):
    with pytest.raises(ValueError):
        checked_select(sql)
    assert checked_select("WITH a AS (SELECT 1) SELECT * FROM a")


def test_readers_read_through_the_console_while_it_holds_the_database(tmp_path):
    import os

    from tests.gateway.conftest import free_port

    db, port = tmp_path / "console.duckdb", free_port()
    seeded = _cli("run", "--engine", "twin", "--duration", "2", "--db", str(db))
    assert seeded.returncode == 0, seeded.stderr  # a recorded run to list
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "streamlit_app.py"),
         "--server.port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "METRONOME_DB": str(db), "METRONOME_METRICS_PORT": "0"})
    try:
        deadline = time.monotonic() + 60
        while not holder_file(str(db)).exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        url = json.loads(holder_file(str(db)).read_text())["url"]
        while True:  # the console opens the database on its first read, and holds it
            try:
                urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b'{"sql"'
                                       b': "SELECT count(*) FROM runs"}'), timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.3)
        listing = _cli("runs", "--db", str(db))
        assert listing.returncode == 0, listing.stderr
        assert "finished" in listing.stdout and "reading through it" in listing.stderr
        writer = _cli("run", "--engine", "twin", "--duration", "1", "--db", str(db))
        lines = [line for line in writer.stderr.splitlines() if line.strip()]
        assert writer.returncode != 0 and len(lines) == 1 and "in use by process" in lines[0]
    finally:
        proc.terminate()
        proc.wait(30)
    assert not holder_file(str(db)).exists()  # withdrawn when the console ends
