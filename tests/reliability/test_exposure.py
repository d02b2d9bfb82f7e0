"""Exposure: loopback by default, SQL built from user input is parameterised."""

import tomllib
from pathlib import Path

from runtime import RunConfig, execute
from store.queries import events, frame_counts, latency_percentiles, run_row, runs

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["'; DROP TABLE runs; --", "x' OR '1'='1", 'a"b', "run\x00id", "%_%"]


def test_console_binds_loopback_unless_told_otherwise():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"


def test_hostile_run_ids_are_data_not_sql(store):
    s = execute(RunConfig(engine="twin", sessions=2, duration_s=1.0), store)
    cur = store.cursor()
    for text in HOSTILE:
        assert run_row(cur, text) is None
        assert frame_counts(cur, text) == {"frames": 0, "silent_frames": 0}
        assert latency_percentiles(cur, text).empty and events(cur, text).empty
    assert run_row(cur, s.run_id)["status"] == "finished"  # the table is still there
    assert len(runs(cur)) == 1


def test_wav_folder_does_not_follow_links_out_of_it(tmp_path):
    import pytest

    from load_gen.wav import load_folder

    outside = tmp_path / "secret.wav"
    outside.write_bytes(b"RIFF")
    folder = tmp_path / "speech"
    folder.mkdir()
    (folder / "a.wav").symlink_to(outside)
    with pytest.raises(ValueError, match="links outside"):
        load_folder(str(folder), 16_000)
