"""Load generators: when sessions arrive and what each frame carries."""

from load_gen.synthetic import LOADS, LoadConfig, SyntheticFrames, arrival_times

__all__ = ["LOADS", "LoadConfig", "SyntheticFrames", "arrival_times"]
