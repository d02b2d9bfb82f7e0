"""The CLI contract: bad input is one line naming the value; a twin run prints the JSON."""

import json
import subprocess
import sys
import wave

import numpy as np
import pytest


def _metronome(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, needle", [
    (["--policy", "window", "--window", "16"], "window 16 is smaller than one block (32 tokens)"),
    (["--policy", "window", "--window", "256", "--pool-blocks", "4"],
     "pool of 4 blocks is smaller than one session's window (9 blocks"),
    (["--model", "/nonexistent/model"], "model '/nonexistent/model' is not one of tiny, smollm2"),
    (["--frame-ms", "0"], "frame period 0.0 ms must be > 0"),
    (["--frame-ms", "-5"], "frame period -5.0 ms must be > 0"),
    (["--block-size", "16"], "block size 16 must be a positive multiple of 32"),
    (["--wait-budget", "1.5"], "wait budget 1.5 must be in (0, 1]"),
    (["--policy", "window"], "policy window needs --window"),
    (["--sessions", "0"], "sessions 0 must be in [1, 100000]"),
    (["--frame-ms", "abc"], "'abc' is not a number"),
    (["--db", "/nonexistent/dir/x.duckdb", "--engine", "twin"], "database folder /nonexistent/dir does not exist"),
    (["--load", "wav"], "load wav needs --wav-dir"),
    (["--load", "wav", "--wav-dir", "/nonexistent/wavs"],
     "WAV folder /nonexistent/wavs does not exist"),
    (["--wav-dir", "/tmp"], "wav dir /tmp only applies to load wav"),
    (["--engine", "twin", "--metrics-port", "70000"], "metrics port 70000 must be in [1, 65535]"),
    (["--engine", "twin", "--metrics-port", "9464", "--metrics-addr", "192.0.2.1"],
     "metrics address 192.0.2.1:9464 cannot be served"),
])
def test_bad_input_is_one_line_naming_the_value(args, needle, tmp_path):
    r = _metronome("run", "--json", "--db", str(tmp_path / "x.duckdb"), *args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("metronome: error:")]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_twin_run_prints_exactly_one_json_object(tmp_path):
    r = _metronome("run", "--engine", "twin", "--json", "--db", str(tmp_path / "t.duckdb"),
                   "--pool-blocks", "64", "--sessions", "12", "--duration", "5")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["engine"] == "twin" and summary["simulated"] is True
    assert summary["stalled"] is True and summary["stall_at_s"] > 0
    listing = _metronome("runs", "--db", str(tmp_path / "t.duckdb"))
    assert summary["run_id"] in listing.stdout and "finished" in listing.stdout


def test_twin_run_replays_a_wav_folder(tmp_path):
    folder = tmp_path / "wavs"
    folder.mkdir()
    t = np.arange(44100) / 44100  # one second: a 300 Hz tone, silent in its second half
    pcm = (0.3 * np.sin(2 * np.pi * 300 * t) * (t < 0.5) * 32767).astype("<i2")
    with wave.open(str(folder / "tone.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes(pcm.tobytes())
    r = _metronome("run", "--engine", "twin", "--json", "--db", str(tmp_path / "w.duckdb"),
                   "--load", "wav", "--wav-dir", str(folder), "--no-wav-loop", "--sessions", "2",
                   "--frame-ms", "160", "--duration", "3", "--policy", "window", "--window", "64")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    # Both sessions replay the one file once: ceil(1 s / 0.16 s) = 7 frames each, then end.
    assert summary["sessions_offered"] == summary["admitted"] == 2
    assert summary["frames"] == 14 and summary["silent_frames"] == 0


def test_mic_without_a_microphone_is_one_plain_line(tmp_path):
    from load_gen.mic import MicrophoneUnavailable, system_input

    try:
        system_input(None, 16000)
        pytest.skip("this machine has a microphone")
    except MicrophoneUnavailable:
        pass
    r = _metronome("run", "--engine", "twin", "--json", "--db", str(tmp_path / "m.duckdb"),
                   "--load", "mic")
    assert r.returncode == 2 and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("metronome: error:")]
    assert len(lines) == 1 and "microphone unavailable: " in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_headless_run_serves_prometheus_metrics_while_it_runs(tmp_path):
    import socket
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", "--engine", "twin", "--paced", "--json",
         "--db", str(tmp_path / "p.duckdb"), "--pool-blocks", "64", "--sessions", "4",
         "--duration", "4", "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        families, deadline = {}, time.monotonic() + 30
        while "metronome_pool_occupancy_ratio" not in families \
                or not families["metronome_pool_occupancy_ratio"].samples:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=2).read().decode()
                families = {f.name: f for f in text_string_to_metric_families(text)}
            except OSError:
                pass
            time.sleep(0.2)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    sample = families["metronome_pool_occupancy_ratio"].samples[0]
    assert sample.labels == {"run_id": summary["run_id"], "engine": "twin", "model": "tiny"}
    assert f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in err


def test_forecast_prints_both_policies_as_json(tmp_path):
    import json as json_
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "forecast", "--engine", "twin", "--json", "--db",
         str(tmp_path / "f.duckdb"), "--load", "poisson", "--arrival-rate", "1",
         "--session-s", "8", "--sessions", "20", "--duration", "20", "--pool-blocks", "360",
         "--seeds", "10"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json_.loads(done.stdout)
    assert out["unbounded"]["runs"] == out["window"]["runs"] == 10
    assert out["window"]["collapsed"] == 0 and out["window"]["policy"] == "window W=128 S=0"
    low, high = out["unbounded"]["ci95"]
    assert low <= out["unbounded"]["collapse_rate"] <= high
