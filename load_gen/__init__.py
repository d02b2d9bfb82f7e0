"""Load generators: when sessions arrive and what each frame carries.

Every source (synthetic tokens, WAV replay, the live microphone) is a `FrameSource`:
`next_frame(frame_s) -> Frame | None` once per frame period (None: the source has ended) and
`close()`. `make_frame_source` builds one per session; `arrival_times` says when sessions arrive.
"""

from load_gen.frames import Frame, FrameSource
from load_gen.mic import MicrophoneUnavailable
from load_gen.synthetic import (AUDIO_LOADS, LOADS, LoadConfig, SyntheticFrames, arrival_times,
                                input_feed, make_frame_source)
from load_gen.tokenizer import FrameTokenizer

__all__ = ["AUDIO_LOADS", "LOADS", "Frame", "FrameSource", "FrameTokenizer", "LoadConfig",
           "MicrophoneUnavailable", "SyntheticFrames", "arrival_times", "input_feed",
           "make_frame_source"]
