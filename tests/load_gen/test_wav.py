"""WAV replay: frames cut to the period, voice found in speech only, looping, folder errors."""

import math
import shutil

import numpy as np
import pytest
from speechfiles import PAD_S, SPEECH, samples_of

from load_gen import FrameSource, LoadConfig, arrival_times, make_frame_source
from load_gen.tokenizer import FrameTokenizer
from load_gen.wav import WavFrames, load_folder


def _all_frames(source, frame_s, limit=10_000):
    frames = []
    while len(frames) < limit and (frame := source.next_frame(frame_s)) is not None:
        frames.append(frame)
    return frames


@pytest.mark.parametrize("frame_ms, tokens_in, rate_hz", [
    (80.0, 8, 16000), (160.0, 16, 16000), (1000.0, 25, 16000), (80.0, 8, 24000)])
def test_frame_count_and_size_follow_duration_over_period(speech, frame_ms, tokens_in, rate_hz):
    path = speech["dir"] / "b_beat.wav"
    expected_samples = round(samples_of(path) * rate_hz / 22050)  # espeak-ng writes 22.05 kHz
    clip = next(c for c in load_folder(str(speech["dir"]), rate_hz) if c.name == "b_beat.wav")
    assert len(clip.samples) == expected_samples and clip.source_rate_hz == 22050
    tok = FrameTokenizer(rate_hz, frame_ms, tokens_in, 2048)
    frame_s = frame_ms / 1e3
    frames = _all_frames(WavFrames(clip, tok, loop=False), frame_s)
    assert len(frames) == math.ceil(expected_samples / tok.frame_samples)
    assert len(frames) == math.ceil(clip.duration_s / frame_s - 1e-9)
    assert all(len(f.audio) == rate_hz * frame_s and len(f.token_ids) == tokens_in
               for f in frames)
    assert [f.t_media_s for f in frames] == pytest.approx([k * frame_s for k in range(len(frames))])
    joined = np.concatenate([f.audio for f in frames])
    assert np.array_equal(joined[:expected_samples], clip.samples)
    assert not joined[expected_samples:].any()  # the last frame is padded with silence


def test_voice_is_found_in_speech_and_not_in_the_padded_silence(speech):
    tok = FrameTokenizer(16000, 80.0, 16, 2048)
    for clip in load_folder(str(speech["dir"]), 16000):
        frames = _all_frames(WavFrames(clip, tok, loop=False), 0.08)
        speech_end_s = PAD_S + speech["speech_s"][clip.name]
        silent = [f for f in frames if f.t_media_s + 0.08 <= PAD_S or f.t_media_s >= speech_end_s]
        spoken = [f for f in frames if PAD_S <= f.t_media_s and f.t_media_s + 0.08 <= speech_end_s]
        assert len(silent) >= 2 * 12 and len(spoken) >= 5, clip.name
        assert not any(f.voice_active for f in silent), clip.name
        # Pauses between words are silence too; most of a sentence is voice.
        assert sum(f.voice_active for f in spoken) >= 0.75 * len(spoken), clip.name


def test_a_looping_session_wraps_and_never_ends(speech):
    clip = next(c for c in load_folder(str(speech["dir"]), 16000) if c.name == "c_hello.wav")
    tok = FrameTokenizer(16000, 80.0, 16, 2048)
    n_frames = 3 * math.ceil(len(clip.samples) / 1280)
    frames = _all_frames(WavFrames(clip, tok, loop=True), 0.08, limit=n_frames)
    assert len(frames) == n_frames  # three times the file and still going
    joined = np.concatenate([f.audio for f in frames])
    assert np.array_equal(joined, np.resize(clip.samples, len(joined)))  # the file, repeated
    assert max(f.t_media_s for f in frames) < clip.duration_s  # position within the file
    assert frames[0].token_ids == tok.tokenize(clip.samples[:1280]).tolist()


def test_the_period_is_the_callers_and_must_match_the_tokenizer(speech):
    clip = load_folder(str(speech["dir"]), 16000)[0]
    source = WavFrames(clip, FrameTokenizer(16000, 80.0, 16, 2048), loop=True)
    with pytest.raises(ValueError, match="frame period 160 ms differs from the 80 ms"):
        source.next_frame(0.16)


def test_sessions_replay_the_files_round_robin_and_arrive_phase_staggered(speech):
    load = LoadConfig("wav", sessions=7, duration_s=5.0, frame_ms=160.0,
                      wav_dir=str(speech["dir"]))
    assert arrival_times(load) == pytest.approx([i / 7 * 0.16 for i in range(7)])
    names = sorted(SPEECH)
    for session_id in range(7):
        source = make_frame_source(load, session_id, vocab_size=2048, tokens_in=16)
        assert isinstance(source, FrameSource) and isinstance(source, WavFrames)
        assert source.clip.name == names[session_id % 3]
        frame = source.next_frame(0.16)
        assert len(frame.token_ids) == 16 and len(frame.audio) == 2560


def test_each_file_is_decoded_once_and_again_when_it_changes(speech, tmp_path):
    shutil.copy(speech["dir"] / "c_hello.wav", tmp_path / "x.wav")
    first = load_folder(str(tmp_path), 16000)[0]
    assert load_folder(str(tmp_path), 16000)[0] is first  # shared by every session
    assert not first.samples.flags.writeable
    shutil.copy(speech["dir"] / "a_fox.wav", tmp_path / "x.wav")
    assert len(load_folder(str(tmp_path), 16000)[0].samples) > len(first.samples)


def test_bad_folders_and_files_are_named(speech, tmp_path):
    with pytest.raises(ValueError, match="load wav needs --wav-dir"):
        LoadConfig("wav")
    with pytest.raises(ValueError, match=f"WAV folder {tmp_path / 'nope'} does not exist"):
        LoadConfig("wav", wav_dir=str(tmp_path / "nope"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        LoadConfig("wav", wav_dir=str(tmp_path / "file.txt"))
    with pytest.raises(ValueError, match=f"WAV folder {tmp_path} has no .wav files"):
        LoadConfig("wav", wav_dir=str(tmp_path))
    shutil.copy(speech["dir"] / "c_hello.wav", tmp_path / "good.wav")
    (tmp_path / "notes.WAV").write_text("not audio")
    with pytest.raises(ValueError, match="notes.WAV is not a RIFF/WAVE file"):
        LoadConfig("wav", wav_dir=str(tmp_path))
    with pytest.raises(ValueError, match="wav dir .* only applies to load wav"):
        LoadConfig("fixed", wav_dir=str(speech["dir"]))
    with pytest.raises(ValueError, match="frame period 5.0 ms is too short for load wav"):
        LoadConfig("wav", wav_dir=str(speech["dir"]), frame_ms=5.0)
    with pytest.raises(ValueError, match="sample rate 4000 Hz"):
        LoadConfig("wav", wav_dir=str(speech["dir"]), sample_rate_hz=4000)
