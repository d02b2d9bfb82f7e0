"""Gateway workers in front of one run (`serve --workers 2`): the run's one gate admits across
the workers, and every frame a client sent is in the server's record with the same silence
and tokens (the frames were cut and tokenized in the workers, run in the run process)."""

from __future__ import annotations

import signal

import pytest

from tests.gateway.conftest import events, finish, frames, run_load

pytestmark = pytest.mark.slow


def test_two_workers_share_one_gate_and_the_records_agree(serve, tmp_path):
    # The run outlasts the client however slowly a loaded machine starts it; SIGTERM ends it
    # once the client is done (serve then records it aborted, its frames kept).
    server = serve("--workers", "2", "--admission", "fixed", "--sessions", "6", duration=120)
    client = finish(run_load(server.url, tmp_path / "client.duckdb", "--sessions", "8",
                             "--duration", "3"))
    server.proc.send_signal(signal.SIGTERM)
    summary = server.summary()
    assert client["admitted"] == 6 and client["rejected"] == 2
    assert summary.admitted == 6 and summary.rejected == 2

    mine = frames(tmp_path / "client.duckdb", client["run_id"])
    theirs = frames(server.db, summary.run_id)
    ids = {d["session_id"]: d["server_session"]
           for kind, d in events(tmp_path / "client.duckdb", client["run_id"]) if kind == "open"}
    mine["server_session"] = mine.session_id.map(ids)
    both = mine.merge(theirs, left_on=["server_session", "frame_idx"],
                      right_on=["session_id", "frame_idx"], suffixes=("_client", "_server"))
    assert len(mine) > 6 * 25 and len(both) == len(mine)
    assert (both.silent_client == both.silent_server).all()
    assert (both.tokens_out_client == both.tokens_out_server).all()
    assert set(theirs.origin) == {"gateway"}
