"""Serve + load on loopback (twin): the client's record of every frame and the server's agree,
and a fixed cap refuses the clients beyond it with server_overloaded on both sides."""

from __future__ import annotations

import pytest

from runtime.remote import InletLimits
from tests.gateway.conftest import events, finish, frames, run_load

pytestmark = pytest.mark.slow
FRAME_MS = 80.0


def _server_ids(client_events) -> dict[int, int]:
    """Client session id → the server's, from the client's `open` events."""
    return {d["session_id"]: d["server_session"] for kind, d in client_events if kind == "open"}


def test_every_frame_sent_is_in_both_records_and_latencies_agree(serve, tmp_path):
    server = serve("--sessions", "16", duration=16)
    client = finish(run_load(server.url, tmp_path / "client.duckdb", "--sessions", "12",
                             "--duration", "10"))
    summary = server.summary()
    assert client["admitted"] == 12 and client["rejected"] == 0
    assert summary.status == "finished" and summary.admitted == 12

    mine = frames(tmp_path / "client.duckdb", client["run_id"])
    theirs = frames(server.db, summary.run_id)
    assert len(mine) > 12 * 100  # ~10 s of 80 ms frames per session
    assert set(theirs.origin) == {"gateway"}
    ids = _server_ids(events(tmp_path / "client.duckdb", client["run_id"]))
    mine["server_session"] = mine.session_id.map(ids)
    both = mine.merge(theirs, left_on=["server_session", "frame_idx"],
                      right_on=["session_id", "frame_idx"], suffixes=("_client", "_server"))
    assert len(both) == len(mine), "frames the client sent are missing from the server's record"
    assert (both.silent_client == both.silent_server).all()
    assert (both.tokens_out_client == both.tokens_out_server).all()
    answered = both[both.latency_ms_client.notna() & both.latency_ms_server.notna()]
    gap = answered.latency_ms_client - answered.latency_ms_server
    # The client's view adds the wire and the wait for the frame's turn. Each side stamps the
    # frame's start on its own clock (the client when it sent the audio, the server when its
    # tick submitted it), so on two loaded cores a frame can read a few ms shorter from the
    # client: agreement is within one frame period, as the issue asks, never a frame off.
    assert (gap > -FRAME_MS).all(), gap.min()
    assert gap.quantile(0.95) < FRAME_MS, gap.describe()
    # By design a frame starts `slack_s` (0) after its audio is complete and a late frame
    # waits at most one `poll_s` (2 ms) for the run thread; tokens are pushed as they come.
    # The rest of the gap is the wire and two event loops on two cores shared with the load
    # client and, in the suite, another test worker: a timing figure, measured side by side
    # by benchmarks/gateway_overhead.py (3.6 ms p50 at one session on a quiet machine), not
    # bounded here (a half-frame bound on the median failed once at 43.9 ms in a loaded run).
    # What is structural: the gap is never below the design's floor by more than the clocks'
    # disagreement, and most frames read the same on both sides within one period (above).
    designed_ms = (InletLimits.slack_s + InletLimits.poll_s) * 1e3
    assert gap.median() > -designed_ms - FRAME_MS / 8, gap.describe()


def test_fixed_cap_refuses_the_rest_with_server_overloaded(serve, tmp_path):
    server = serve("--admission", "fixed", "--sessions", "8", duration=8)
    client = finish(run_load(server.url, tmp_path / "client.duckdb", "--sessions", "12",
                             "--duration", "3"))
    summary = server.summary()
    assert client["admitted"] == 8 and client["rejected"] == 4
    assert summary.admitted == 8 and summary.rejected == 4
    rejects = [d for kind, d in events(tmp_path / "client.duckdb", client["run_id"])
               if kind == "reject"]
    assert {(d["type"], d["code"]) for d in rejects} == {("server_overloaded",
                                                          "server_overloaded")}
    server_rejects = [d for kind, d in events(server.db, summary.run_id) if kind == "reject"]
    assert len(server_rejects) == 4 and {d["origin"] for d in server_rejects} == {"gateway"}
