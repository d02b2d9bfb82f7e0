"""`metronome serve` in a subprocess on a free loopback port (twin only), and the helpers the
gateway tests share."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from runtime.run_summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, tmp_path: Path, *flags: str, duration: float,
                 startup_s: float = 60) -> None:
        self.port = free_port()
        self.db = tmp_path / "server.duckdb"
        self.url = f"ws://127.0.0.1:{self.port}/v1/realtime"
        self.err = open(tmp_path / "serve.err", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--engine", "twin", "--port",
             str(self.port), "--db", str(self.db), "--duration", str(duration), "--policy",
             "window", "--window", "128", "--json", *flags],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.err, text=True,
            env={**os.environ, "METRONOME_LOG": "WARNING"})
        deadline = time.monotonic() + startup_s  # a vLLM engine starts first (flags' --engine)
        while "listening" not in Path(self.err.name).read_text():
            assert self.proc.poll() is None, Path(self.err.name).read_text()[-2000:]
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)

    def summary(self, timeout: float = 60) -> RunSummary:
        """The run's summary as `serve --json` printed it."""
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, Path(self.err.name).read_text()[-2000:]
        return RunSummary.from_json(json.loads(out))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self.err.close()


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(*flags: str, duration: float, startup_s: float = 60) -> Served:
        served = Served(tmp_path, *flags, duration=duration, startup_s=startup_s)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def run_load(url: str, db: Path, *flags: str, timeout: float = 90) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "load", "--url", url, "--db", str(db), "--json",
         *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "METRONOME_LOG": "WARNING"})


def finish(proc: subprocess.Popen, timeout: float = 90) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out)


def frames(db: Path, run_id: str):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT * FROM frames WHERE run_id = ? ORDER BY session_id, "
                           "frame_idx", [run_id]).df()


def events(db: Path, run_id: str) -> list[tuple[str, dict]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT kind, detail FROM events WHERE run_id = ? ORDER BY t",
                           [run_id]).fetchall()
    return [(kind, json.loads(detail)) for kind, detail in rows]
