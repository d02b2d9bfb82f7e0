"""What a calibration is valid for: this machine in one line (CPU model, cores, the flags that
change a step's cost, the GPU), or the twin's cost model, whose speed is the model, not the host."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess

from engine.twin import CostModel
from store import queries


@functools.lru_cache(maxsize=1)
def host_machine() -> str:
    """This machine in one line: host name, CPU model and cores, and the GPU when there is one."""
    from engine.dtype import cpu_model, flags_note, step_flags

    cpu = cpu_model() or platform.processor() or platform.machine()
    flags = step_flags()
    text = (f"{platform.node()} · {cpu} · {os.cpu_count()} cores · "
            f"{' '.join(flags) or 'no avx2'}{flags_note()}")
    if shutil.which("nvidia-smi"):
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            gpu = ""
        if gpu:
            text += f" · {gpu.splitlines()[0]}"
    return text


def machine_key(engine: str, cur=None, cost: CostModel | None = None) -> str:
    """What a calibration is valid for besides engine and model: the host for vLLM; for the
    twin, its cost model (the newest fitted one in the store, or the default) — the twin's speed
    is the model, not the host."""
    if engine != "twin":
        return host_machine()
    row = queries.latest_twin_model(cur) if cost is None and cur is not None else None
    if row is not None:
        cost = CostModel(row["a_ms"], row["b_ms_per_token"], row["c_ms_per_resident_token"],
                         source=str(row["source_run_id"]))
    cost = cost or CostModel()
    return (f"simulated · cost {cost.source} a={cost.a_ms:g} b={cost.b_ms_per_token:g} "
            f"c={cost.c_ms_per_resident_token:g}")
