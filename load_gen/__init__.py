"""Load generators: when sessions arrive and what each frame carries.

Every source implements `next_frame(frame_s) -> Frame | None` (None: the source has ended) and is
built per session by `make_frame_source`; `arrival_times` says when sessions arrive.
"""

from load_gen.synthetic import (LOADS, Frame, LoadConfig, SyntheticFrames, arrival_times,
                                make_frame_source)

__all__ = ["LOADS", "Frame", "LoadConfig", "SyntheticFrames", "arrival_times",
           "make_frame_source"]
