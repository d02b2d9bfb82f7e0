"""Speech made offline with espeak-ng and sox (installed by `scripts/setup.sh test`): the
`speech` fixture and the sox helpers the tests share."""

import shutil
import subprocess

import pytest

# name -> text; each file is the spoken text with one second of digital silence on both sides.
SPEECH = {
    "a_fox.wav": "The quick brown fox jumps over the lazy dog.",
    "b_beat.wav": "Metronome keeps the beat while the model listens and answers.",
    "c_hello.wav": "Hello there.",
}
PAD_S = 1.0
_TRIM = ("silence", "1", "0.01", "0.1%")  # sox: drop the start until 10 ms above -60 dBFS


def _need_tools():
    missing = [tool for tool in ("espeak-ng", "sox", "soxi") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed "
                    "(`bash scripts/setup.sh test` installs them)")


def samples_of(path) -> int:
    return int(subprocess.run(["soxi", "-s", str(path)], check=True, capture_output=True,
                              text=True).stdout)


def rate_of(path) -> int:
    return int(subprocess.run(["soxi", "-r", str(path)], check=True, capture_output=True,
                              text=True).stdout)


def sox(*args):
    subprocess.run(["sox", *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="session")
def speech(tmp_path_factory):
    """{"dir": the folder of padded WAVs, "speech_s": {name: seconds of speech in the file}}."""
    _need_tools()
    raw = tmp_path_factory.mktemp("raw")
    folder = tmp_path_factory.mktemp("speech")
    speech_s = {}
    for name, text in SPEECH.items():
        spoken, trimmed = raw / name, raw / f"trimmed_{name}"
        subprocess.run(["espeak-ng", "-w", str(spoken), text], check=True, capture_output=True)
        # Cut espeak-ng's own lead-in and tail, so the speech spans exactly [PAD_S, PAD_S + s).
        sox(spoken, trimmed, *_TRIM, "reverse", *_TRIM, "reverse")
        speech_s[name] = samples_of(trimmed) / rate_of(trimmed)
        sox(trimmed, folder / name, "pad", PAD_S, PAD_S)
    return {"dir": folder, "speech_s": speech_s}
