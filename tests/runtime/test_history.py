"""A session's rollover prompt (runtime/history.py): the first S and the last W inputs as its
KV held them; an audio-in model's as whole frames with their audio."""

import numpy as np
import pytest

from runtime.history import RolloverHistory


def test_text_history_keeps_sinks_and_window_without_repeats():
    h = RolloverHistory(window_tokens=4, sink_tokens=2)
    h.add([1, 2, 3])
    assert h.prompt() == ([1, 2, 3], None)  # early: sinks and window overlap, no repeat
    h.add([4, 5, 6])
    assert h.prompt() == ([1, 2, 3, 4, 5, 6], None)
    h.add([7, 8])
    assert h.prompt() == ([1, 2, 5, 6, 7, 8], None)
    assert h.sink_tokens == 2


def test_a_live_change_moves_the_window_and_only_shrinks_sinks():
    h = RolloverHistory(window_tokens=4, sink_tokens=2)
    h.add([1, 2, 3, 4, 5, 6, 7, 8])
    h.follow(window_tokens=2, sink_tokens=1)
    assert h.prompt() == ([1, 7, 8], None)
    h.follow(window_tokens=3, sink_tokens=2)  # sinks never grow back
    h.add([9])
    assert h.prompt() == ([1, 7, 8, 9], None)


def test_audio_history_keeps_whole_frames_with_their_audio():
    frame = (3, 4, 4, 5)  # bos, AUDIO × 2, eos
    h = RolloverHistory(window_tokens=9, sink_tokens=1, frame_ids=frame)  # 2 frames, 1 sink
    audios = [np.full(4, i, np.float32) for i in range(5)]
    for a in audios[:2]:
        h.add(list(frame), a)
    ids, kept = h.prompt()
    assert ids == list(frame) * 2 and [a[0] for a in kept] == [0, 1]  # overlap: no repeat
    for a in audios[2:]:
        h.add(list(frame), a)
    ids, kept = h.prompt()
    # The sink frame (S rounds up to a frame) and the last W // 4 = 2 frames.
    assert ids == list(frame) * 3 and [a[0] for a in kept] == [0, 3, 4]
    assert h.sink_tokens == 4


def test_history_refuses_a_window_below_one_token():
    with pytest.raises(ValueError, match="W=0"):
        RolloverHistory(0, 0)
