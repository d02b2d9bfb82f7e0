"""Fixtures of the load tests: `speech`, a folder of spoken WAV files."""

from speechfiles import speech  # noqa: F401 - a fixture, found by name
