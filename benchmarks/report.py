"""Shared by the benchmark scripts: machine facts and one replaceable section per benchmark in
docs/benchmarks/log.md, the dated detail behind docs/BENCHMARKS.md's table of current figures
(a rerun replaces its own section and leaves the others alone; the table's row is the
rerunner's to update)."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "log.md"
HEADER = "# Benchmarks: the dated log\n\nEvery number below was produced by the command in its section.\n"


def machine() -> str:
    from engine.dtype import cpu_model

    model = cpu_model() or platform.processor() or platform.machine()
    return f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}"


def write_section(title: str, body: str) -> Path:
    """Replace (or append) the `## title` section of docs/benchmarks/log.md."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = DOC.read_text() if DOC.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    DOC.write_text(text)
    return DOC
