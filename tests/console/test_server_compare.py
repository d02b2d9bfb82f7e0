"""Runs the load client recorded against two different servers, side by side in the console
(AppTest): a vLLM-style segmenting server (tests/gateway/fake_realtime.vllm_like, vLLM's
/v1/realtime event sequence) and Metronome's own gateway (`metronome serve` on the twin). The
Runs page names each run's server, URL and protocol and compares them on shared axes; the
Experiments page draws the same pair."""

from __future__ import annotations

import functools
import json

import pandas as pd
import pyarrow as pa

from gateway.client import LoadClientConfig, run_load
from store import open_store
from tests.console.conftest import page
from tests.gateway import fake_realtime as fake
from tests.gateway.conftest import Served
from tests.gateway.fake_realtime import FakeServer

SERVER_CHARTS = ("Frame latency vs budget", "Silent share of frames",
                 "When silence happens (per session)")
LOAD = {"sessions": 2, "duration_s": 2.4, "frame_ms": 80.0}


def _record(db: str, url: str, **settings) -> dict:
    store = open_store(db)
    try:
        return run_load(LoadClientConfig(url=url, **LOAD, **settings), store)
    finally:
        store.close()


def _two_servers(db: str, tmp_path) -> tuple[dict, dict, str]:
    with FakeServer(functools.partial(fake.vllm_like, segment_s=1.0)) as vllm:
        segmenting = _record(db, vllm.url, protocol="vllm", model="m")
    gateway = Served(tmp_path, "--admission", "fixed", "--sessions", "2", "--frame-ms", "80",
                     duration=60)
    try:
        framed = _record(db, gateway.url, protocol="openai")
    finally:
        gateway.stop()
    return segmenting, framed, vllm.url


def _charts(at) -> list[tuple[str, dict, pd.DataFrame]]:
    """(title, spec, its first dataset) for every chart on the page."""
    out = []
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        title = spec.get("title")
        title = title.get("text") if isinstance(title, dict) else title
        data = element.proto.datasets[0].data.data if element.proto.datasets else None
        frame = pa.ipc.open_stream(data).read_all().to_pandas() if data else pd.DataFrame()
        out.append((title, spec, frame))
    return out


def _domains(spec: dict, channel: str) -> list:
    """Every scale domain the spec gives `channel` (layers included)."""
    found = []
    for layer in [spec, *spec.get("layer", [])]:
        scale = (layer.get("encoding", {}).get(channel) or {}).get("scale") or {}
        if "domain" in scale:
            found.append(scale["domain"])
    return found


def _check_side_by_side(at, segmenting: dict, framed: dict) -> None:
    charts = _charts(at)
    titles = [title for title, _, _ in charts]
    for title in SERVER_CHARTS:
        assert titles.count(title) == 2, titles
    assert "KV pool occupancy" not in titles  # the client sees no server's pool
    # Shared axes: every chart of a kind has the same time (and latency) domain in both columns.
    for title in SERVER_CHARTS:
        specs = [spec for t, spec, _ in charts if t == title]
        assert _domains(specs[0], "x") == _domains(specs[1], "x") != [], title
    latency = [spec for t, spec, _ in charts if t == SERVER_CHARTS[0]]
    assert _domains(latency[0], "y") == _domains(latency[1], "y") != []
    # The segmenting server is silent between its answers; Metronome's gateway answers frames.
    shares = [frame.silent_share.mean() for t, _, frame in charts if t == SERVER_CHARTS[1]]
    assert shares[0] > 0.5 > shares[1], shares
    maps = [frame for t, _, frame in charts if t == SERVER_CHARTS[2]]
    assert all(set(m.session_id) == {0, 1} for m in maps)
    text = " ".join(m.value for m in at.markdown)
    assert "**vLLM /v1/realtime**" in text and "**Metronome gateway**" in text
    assert f"silent {segmenting['silent_frames'] / segmenting['frames']:.1%}" in text
    assert f"silent {framed['silent_frames'] / framed['frames']:.1%}" in text


def test_runs_page_names_the_servers_and_compares_them_on_shared_axes(db, tmp_path):
    segmenting, framed, url = _two_servers(db, tmp_path)
    at = page("runs")
    assert not at.exception, at.exception
    table = at.dataframe[0].value.set_index("run_id")
    assert set(table.engine) == {"remote"}
    assert table.server[segmenting["run_id"]] == (
        f"vLLM /v1/realtime · protocol vllm · deltas by latest frame sent · {url}")
    assert table.server[framed["run_id"]].startswith(
        "Metronome gateway · protocol openai · deltas by server frame_idx · ws://127.0.0.1:")
    assert table.silent_rate[segmenting["run_id"]] > 0.5
    at.multiselect(key="runs_engine").select("remote").run()
    assert len(at.dataframe[0].value) == 2

    at.selectbox(key="runs_compare_a").select(segmenting["run_id"])
    at.selectbox(key="runs_compare_b").select(framed["run_id"])
    at.toggle(key="runs_compare_show").set_value(True).run()
    assert not at.exception, at.exception
    _check_side_by_side(at, segmenting, framed)
    summary = at.dataframe[1].value
    assert list(summary.columns) == [segmenting["run_id"], framed["run_id"]]
    assert summary.loc["protocol"].tolist() == ["vllm", "openai"]
    assert summary.loc["engine"].tolist() == ["remote", "remote"]


def test_experiments_page_draws_the_two_servers(db, tmp_path):
    segmenting, framed, _ = _two_servers(db, tmp_path)
    at = page("experiments")
    assert not at.exception, at.exception
    at.selectbox(key="exp_servers_a").select(segmenting["run_id"])
    at.selectbox(key="exp_servers_b").select(framed["run_id"])
    at.toggle(key="exp_servers_show").set_value(True).run()
    assert not at.exception, at.exception
    _check_side_by_side(at, segmenting, framed)


def test_the_live_page_opens_a_run_the_load_client_recorded(db, tmp_path):
    with FakeServer(functools.partial(fake.vllm_like, segment_s=1.0)) as vllm:
        seen = _record(db, vllm.url, protocol="vllm", model="m")
    at = page()  # the Live page lands on the newest run: this one
    assert not at.exception, at.exception
    shown = {m.label: m.value for m in at.metric}
    assert shown["frames"] == str(seen["frames"])
    assert shown["silent"] == f"{seen['silent_frames'] / seen['frames']:.1%}"
    assert any("recorded by the load client" in c.value for c in at.caption)
