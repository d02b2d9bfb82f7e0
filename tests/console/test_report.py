"""`metronome report`: HTML and PNG reports of one run or two side by side."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services import report
from runtime import RunConfig, execute


@pytest.fixture
def two_runs(store):
    ids = [execute(RunConfig(engine="twin", sessions=4, pool_blocks=48, duration_s=3.0,
                             **policy), store)["run_id"]
           for policy in ({}, {"policy": "window", "window": 64})]
    store.writer.flush()
    return ids


def test_html_report_is_self_contained_and_names_both_runs(store, two_runs):
    page = report.render(store.cursor(), two_runs, "html").decode()
    assert "vs".join(f" {i} " for i in two_runs).strip() in page
    assert "cdn.jsdelivr" not in page  # opens without a network
    assert "stall_at_s" in page and "window W=64 S=0" in page


def test_png_report_is_a_png(store, two_runs):
    data = report.render(store.cursor(), two_runs[:1], "png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_report_refuses_unknown_runs_formats_and_three_runs(store, two_runs):
    cur = store.cursor()
    with pytest.raises(ValueError, match="not in the database"):
        report.render(cur, ["nope"], "html")
    with pytest.raises(ValueError, match="one run or two"):
        report.render(cur, [*two_runs, two_runs[0]], "html")
    with pytest.raises(ValueError, match="format 'pdf'"):
        report.render(cur, two_runs, "pdf")


def test_cli_report_writes_the_file(tmp_path, store, two_runs):
    db, out = store.path, tmp_path / "r.png"
    store.close()  # the CLI is another process: it needs the file lock
    done = subprocess.run([sys.executable, "-m", "cli.main", "report", *two_runs, "--db", db,
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(out) and out.read_bytes()[:4] == b"\x89PNG"


def test_cli_report_refuses_a_missing_folder(tmp_path, store, two_runs, capsys):
    from cli.main import EXIT_USAGE, main

    assert main(["report", two_runs[0], "--db", store.path,
                 "--out", str(tmp_path / "no" / "r.html")]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
