"""The pieces without a network: a client's PCM16 becomes the same frames and tokens as a WAV
replay of the same audio, buffering is bounded, and the protocol names what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from gateway import protocol
from gateway.protocol import GatewayLimits, ProtocolError, SessionSettings
from load_gen.remote import IDLE, BufferFull, RemoteFrames, pcm16_to_float
from load_gen.tokenizer import FrameTokenizer
from load_gen.wav import Clip, WavFrames
from runtime.remote import InletLimits

TOK = FrameTokenizer(16_000, 80.0, 16, 2048)


def _speechish(n):
    t = np.arange(n) / 16_000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 5 * t))).astype(np.float32)


def test_client_audio_cut_and_tokenized_like_a_wav_replay():
    audio = pcm16_to_float((_speechish(TOK.frame_samples * 5) * 32768).astype("<i2").tobytes())
    remote = RemoteFrames(TOK, max_buffer_s=2.0)
    for chunk in np.array_split(audio, 7):  # chunk edges need not be frame edges
        remote.append(chunk)
    wav = WavFrames(Clip("x", audio, 16_000, 16_000), TOK, loop=False)
    for _ in range(5):
        assert remote.next_frame(0.08).token_ids == wav.next_frame(0.08).token_ids
    assert remote.next_frame(0.08) is IDLE and remote.underruns == 1


def test_a_partial_last_frame_is_not_a_frame_and_late_audio_is_ignored():
    remote = RemoteFrames(TOK, max_buffer_s=2.0)
    remote.append(np.zeros(TOK.frame_samples + 100, np.float32))
    remote.end("client disconnected")
    remote.append(np.zeros(TOK.frame_samples, np.float32))
    assert remote.next_frame(0.08).token_ids
    assert remote.next_frame(0.08) is None and remote.end_reason == "client disconnected"


def test_buffered_audio_is_bounded():
    remote = RemoteFrames(TOK, max_buffer_s=0.5)
    remote.append(np.zeros(8_000, np.float32))
    with pytest.raises(BufferFull, match="0.5 s allowed"):
        remote.append(np.zeros(1, np.float32))


@pytest.mark.parametrize("text, code", [
    ("{oops", "invalid_json"), ("[1]", "invalid_event"), ('{"type": "x.y"}', "unknown_event")])
def test_malformed_events_are_named(text, code):
    with pytest.raises(ProtocolError) as info:
        protocol.parse(text)
    assert info.value.code == code


def test_bad_audio_and_formats_are_refused():
    for audio in (None, "not base64!", "AAAA"):  # missing, invalid, an odd byte count
        with pytest.raises(ProtocolError, match="audio|base64|16-bit"):
            protocol.audio_bytes({"type": "input_audio_buffer.append", "audio": audio})
    with pytest.raises(ProtocolError, match="input_audio_format.*only pcm16"):
        protocol.updated({"session": {"input_audio_format": "g711_ulaw"}}, SessionSettings())
    with pytest.raises(ProtocolError, match=r"audio.input.format.rate.*\[8000, 48000\]"):
        protocol.updated({"session": {"audio": {"input": {"format": {"rate": 96_000}}}}},
                         SessionSettings())
    with pytest.raises(ProtocolError, match="output_modalities.*no audio output"):
        protocol.updated({"session": {"type": "realtime", "output_modalities": ["audio"]}},
                         SessionSettings())
    with pytest.raises(ProtocolError, match="audio.input.format.type.*audio/pcm"):
        protocol.updated({"session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}},
                         SessionSettings())


def test_a_session_update_in_either_shape_is_taken_and_echoed():
    ga = protocol.updated({"session": {"type": "realtime", "output_modalities": ["text"],
                                       "instructions": "be brief", "audio": {
                                           "input": {"format": {"type": "audio/pcm",
                                                                "rate": 16_000}},
                                           "output": {"voice": "marin"}}}}, SessionSettings())
    assert (ga.rate_hz, ga.dialect, ga.instructions, ga.voice) == (16_000, "ga", "be brief",
                                                                   "marin")
    beta = protocol.updated({"session": {"modalities": ["text"], "input_audio_format": "pcm16"}},
                            SessionSettings(rate_hz=16_000))
    assert (beta.rate_hz, beta.dialect) == (24_000, "beta")  # beta's pcm16 is 24 kHz
    base = {"id": "sess_1", "model": "tiny",
            "metronome": {"frame_ms": 80.0, "run_id": "r", "model_rate_hz": 16_000}}
    shown = protocol.session_object(base, ga)
    assert shown["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16_000}
    assert shown["metronome"]["frame_samples"] == 1280 and shown["instructions"] == "be brief"
    assert protocol.session_object(base, beta)["input_audio_format"] == "pcm16"


def test_limits_name_the_bad_value_and_range():
    with pytest.raises(ValueError, match=r"max message 10 bytes must be in \[1024"):
        GatewayLimits(max_message_bytes=10)
    with pytest.raises(ValueError, match=r"max buffered audio 100 s must be in \[0.1, 60\]"):
        InletLimits(max_buffer_s=100)


def test_an_empty_frame_is_sent_as_such():
    row = {"frame_idx": 3, "silent": True, "tokens_out": 0, "latency_ms": None}
    event = protocol.frame_event(row, None)
    assert event["type"] == "metronome.frame" and event["response_id"] is None
    assert event["frame"]["silent"] is True and event["frame"]["tokens_out"] == 0


class _Told:
    def __init__(self):
        self.got = []

    def deliver(self, kind, data):
        self.got.append((kind, data))


def test_a_frames_deltas_add_up_to_its_row_before_its_done():
    from runtime.config import RunConfig
    from runtime.remote import Client, Inlet

    inlet = Inlet(RunConfig(engine="twin", load="gateway"), vocab_size=2048)
    told = _Told()
    client = Client(told, RemoteFrames(inlet.tokenizer, 2.0), session_id=7, state="live")
    inlet._clients[7] = client
    client.sent[3] = 2  # two tokens went out at polls; two more came before the deadline
    inlet.observe("frames", {"session_id": 7, "frame_idx": 3, "tokens_out": 4})
    assert [kind for kind, _ in told.got] == ["delta", "frame"]
    assert told.got[0][1]["n"] == 2 and told.got[0][1]["frame_idx"] == 3
    inlet.observe("frames", {"session_id": 7, "frame_idx": 4, "tokens_out": 0})  # empty frame
    assert [kind for kind, _ in told.got[2:]] == ["frame"]


def test_each_frame_is_resampled_on_its_own_as_soxr_does_it():
    import soxr

    from load_gen.remote import AudioCutter

    cutter = AudioCutter(TOK)
    cutter.set_rate(24_000)
    audio = _speechish(1920 * 3) * np.linspace(0.2, 1, 1920 * 3, dtype=np.float32)
    frames = cutter.cut(audio[:2500]) + cutter.cut(audio[2500:])
    assert len(frames) == 3 and cutter.pending == 0
    for k, frame in enumerate(frames):  # the kept resampler remembers nothing across frames
        alone = soxr.resample(audio[k * 1920:(k + 1) * 1920], 24_000, 16_000)
        assert np.array_equal(frame.audio, alone)
        assert frame.token_ids == TOK.tokenize(alone).tolist()
