"""Text the console shows for a run: an unknown figure reads "unknown", not a number."""

from console import views
from runtime.run_summary import RunSummary


def test_a_run_with_no_frames_has_an_unknown_silent_share_not_zero():
    assert views.silent_text(RunSummary("r", "finished")) == "unknown (no frames)"
    assert views.silent_text(RunSummary("r", "finished", frames=40, silent_frames=1,
                                        silent_rate=0.025)) == "2.5%"
