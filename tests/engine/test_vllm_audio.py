"""Real vLLM (audio-tiny, CPU): each frame's audio goes through the model's processor and
encoder, one frame per encoder window, into the session's KV; the window and sinks bound it as
on the text model, and unbounded KV walks into the same cliff.

One windowed engine (max_model_len 512, so a long-answer run rolls over) and one unbounded
engine with a small pool, shared through tests/vllm_machine.EnginePool."""

import hashlib

import numpy as np
import pytest

from runtime import RunConfig, Runner
from runtime.config import ScheduledChange
from tests.load_gen.speechfiles import speech  # noqa: F401 - a fixture, found by name

pytestmark = pytest.mark.vllm

WINDOWED = dict(engine="vllm", model="audio-tiny", policy="window", window=128, sinks=32,
                pool_blocks=64, max_model_len=512, frame_ms=80.0)
UNBOUNDED = dict(engine="vllm", model="audio-tiny", policy="unbounded", pool_blocks=24,
                 frame_ms=80.0)


@pytest.fixture(scope="module")
def windowed(vllm_engines):
    return vllm_engines.get(RunConfig(**WINDOWED))


def _features_digest(engine, audio):
    """The sha1 of the input features the model's own processor makes of `audio`, in the
    model's dtype as vLLM casts them (bf16 where the CPU computes it: engine/dtype.py), read
    back as float32 as the encoder's counter reads them: what the encoder must see."""
    import torch
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(engine.model_path))
    feats = processor.feature_extractor(audio, sampling_rate=16_000, max_length=len(audio),
                                        padding="max_length", return_tensors="pt")
    cast = feats["input_features"][0].to(getattr(torch, engine.dtype)).float()
    return hashlib.sha1(np.ascontiguousarray(cast.numpy()).tobytes()).hexdigest()


def _frame(engine, session_id, audio):
    handle = engine.submit(session_id, list(engine.frame_token_ids), 2, audio=[audio])
    assert handle.wait(30) and not handle.failed, handle.error
    return handle


def test_a_frames_audio_reaches_the_encoder(windowed):
    engine = windowed
    assert engine.input_path == "audio encoder" and engine.frame_token_ids == (3, 4, 4, 5)
    t = np.arange(1280) / 16_000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    chirp = (0.3 * np.sin(2 * np.pi * (200 + 3000 * t) * t)).astype(np.float32)
    before = engine.input_stats()
    engine.open(9001)
    engine.open(9002)
    try:
        _frame(engine, 9001, tone)
        _frame(engine, 9001, chirp)
        _frame(engine, 9002, tone)  # the same audio in another session: encoded again
        counts = engine.encoder_counts()
    finally:
        engine.close(9001)
        engine.close(9002)
    # The same ids each time: only the audio differs, and the encoder saw exactly it.
    seen = [d for d, mel in counts["digests"][-3:]]
    assert seen == [_features_digest(engine, a) for a in (tone, chirp, tone)]
    assert seen[0] != seen[1]
    assert {mel for _, mel in counts["digests"][-3:]} == {8}  # one frame of mel, not 30 s
    after = engine.input_stats()
    assert after["encoder_frames"] - before["encoder_frames"] == 3
    assert after["audio_tokens"] - before["audio_tokens"] == 6


def test_the_frame_render_equals_vllms_and_falls_back(windowed, monkeypatch, caplog):
    """engine/audio_render.py answers a frame-sized call from the feature extractor alone; what
    vLLM keeps of it equals vLLM's own path, any other call is vLLM's, and a frame render that
    differs from vLLM's on its first check leaves the processor on vLLM's path."""
    import torch
    from transformers import BatchFeature

    from engine import audio_render

    processor = windowed._llm.renderer.get_mm_processor()
    t = np.arange(1280) / 16_000
    frames = [(0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32) for f in (440, 1250)]

    def main(audios, on):
        audio_render.use_frame_path(processor, on)
        items = processor.info.parse_mm_data({"audio": [(a, 16_000) for a in audios]})
        return processor._apply_hf_processor_main(items, {})

    calls = []
    real = audio_render.frame_fields
    monkeypatch.setattr(audio_render, "frame_fields", lambda *a: calls.append(a) or real(*a))
    try:
        processor.__dict__.pop(audio_render._MARK, None)  # as a fresh engine's: unchecked
        stock = main(frames, False)
        assert audio_render.frame_path_checked(processor) is None and not calls
        fast = main(frames, True)
        assert len(calls) == 1 and audio_render.frame_path_checked(processor) is True
        for key in audio_render.FIELDS:
            assert fast[key].shape == stock[key].shape and fast[key].dtype == stock[key].dtype
            assert torch.allclose(fast[key].float(), stock[key].float(), atol=1e-4)
        assert tuple(fast["input_features"].shape) == (2, 128, 8)  # one frame of mel each
        # A clip that is not one frame long goes to vLLM's path.
        main([np.zeros(1000, np.float32)], True)
        assert len(calls) == 1
        # A frame render that differs is caught on its first check and never used.
        processor.__dict__.pop(audio_render._MARK)
        monkeypatch.setattr(audio_render, "frame_fields", lambda *a: BatchFeature({
            k: v + 1 if k == "input_features" else v for k, v in real(*a).items()}))
        with caplog.at_level("WARNING", logger="engine.audio_render"):
            out = main(frames, True)
        assert "input_features: values differ" in caplog.text
        assert audio_render.frame_path_checked(processor) is False
        assert torch.equal(out["input_features"], stock["input_features"])
        assert torch.equal(main(frames, True)["input_features"], stock["input_features"])
    finally:  # the shared engine's processor checks its next frame afresh
        processor.__dict__.pop(audio_render._MARK, None)
        audio_render.use_frame_path(processor, True)


@pytest.fixture(scope="module")
def wav_run(windowed, speech, tmp_path_factory):  # noqa: F811 - the fixture
    from store import Store

    st = Store(str(tmp_path_factory.mktemp("db") / "audio.duckdb"))
    cfg = RunConfig(load="wav", wav_dir=str(speech["dir"]), sessions=3, duration_s=6.0,
                    tokens_out=4, open_budget=8, **WINDOWED)
    yield Runner(cfg, windowed, st).run(), st
    st.close()


def test_windowed_audio_sessions_keep_the_block_bound(wav_run):
    s, _ = wav_run
    assert s.status == "finished", s.reason
    assert s.input_path == "audio encoder"
    assert s.input == "wav audio through the model's audio encoder"
    # Each frame handed over is encoded once, as one frame of mel (2 audio tokens); a session's
    # last frame, handed over as the run closed it, may be dropped before its encode (CI: 253
    # of 255 over 3 sessions), so up to one frame a session goes unencoded.
    a = s.audio
    assert a.frames_submitted - 3 <= a.encoder_frames <= a.frames_submitted, a
    assert a.audio_tokens_per_frame == 2.0
    assert s.audio.tokens_in_per_frame == 4
    assert s.stalled is False and s.silent_memory_frames == 0
    # Each session's KV outgrew W + S (75 frames of 7 tokens; a rollover near 512) and stayed
    # within its blocks.
    assert s.max_resident_blocks <= (128 + 32) // 32 + 1
    assert s.max_occupancy < 1.0
    assert s.frames >= 3 * 70


def test_the_twin_fits_from_an_audio_run(wav_run):
    """`metronome fit` on an audio run: its steps count each frame's tokens as the processor
    made them (whole frames of 4, encoder time inside the step), and the twin the fit gives
    serves the run's load at those tokens."""
    from dataclasses import replace

    from engine.twin import TwinEngine
    from engine.twin_cost import fit_cost_model
    from store import Store
    from store.queries import steps

    s, st = wav_run
    rows = steps(st.cursor(), s.run_id)
    prompts = [r["prompt_tokens"] for r in rows if r["prompt_tokens"]]
    assert prompts and all(p % s.audio.tokens_in_per_frame == 0 for p in prompts), prompts[:20]
    cost, facts = fit_cost_model(rows, source=s.run_id)
    assert facts["n_steps"] >= 20 and cost.source == s.run_id
    cfg = replace(RunConfig(load="fixed", sessions=3, duration_s=6.0, tokens_out=4,
                            **{**WINDOWED, "engine": "twin"}),
                  tokens_in=s.audio.tokens_in_per_frame)
    twin_store = Store(":memory:")
    try:
        twin = Runner(cfg, TwinEngine(cfg.engine_config(), cost), twin_store).run()
    finally:
        twin_store.close()
    assert twin.status == "finished" and twin.twin_cost_source == s.run_id
    assert twin.frames >= 3 * 70


def test_a_live_w_change_and_a_rollover_on_audio(windowed, speech, store):  # noqa: F811
    cfg = RunConfig(load="wav", wav_dir=str(speech["dir"]), sessions=2, duration_s=10.0,
                    tokens_out=8, changes=(ScheduledChange.parse("2:window=64"),), **WINDOWED)
    s = Runner(cfg, windowed, store).run()
    assert s.status == "finished", s.reason
    assert len(s.changes) == 1 and s.window == 64
    # 4 + 7 tokens a frame reach max_model_len (512) in about 46 frames: a session rolls
    # over, re-encoding its sink and window frames (audio items beyond one per frame). At
    # least one: on a slow or loaded CPU a session's skipped frames (submitted ones only grow
    # its KV) can carry its rollover past the run's end (on a 2-core AVX2-only EPYC at step
    # a=15 ms, 6 s held 40 submitted frames a session and none rolled over: 10 s).
    assert s.rollovers >= 1, s
    assert s.audio.frames_submitted > s.frames - s.silent_frames
    # (Up to one frame a session, handed over as the run closed it, is never encoded.)
    assert s.audio.frames_submitted - 2 <= s.audio.encoder_frames <= s.audio.frames_submitted
    assert s.stalled is False and s.silent_memory_frames == 0


def test_unbounded_audio_sessions_walk_into_the_cliff(vllm_engines, store):
    engine = vllm_engines.get(RunConfig(**UNBOUNDED))
    cfg = RunConfig(load="fixed", sessions=6, duration_s=8.0, tokens_out=4, **UNBOUNDED)
    s = Runner(cfg, engine, store).run()
    assert s.status == "finished", s.reason
    assert "white noise" in s.input and s.input_path == "audio encoder"
    assert s.max_occupancy >= 0.95
    # The cliff is the pool filling and the conversations going quiet for memory. Whether it
    # ends in a full stall (no token for STALL_TICKS ticks) depends on timing. On a 2-core EPYC
    # it stalled by 4.32 s (the earlier bound's failure); a CI run submitted 236 frames in 8 s
    # with the pool >= 95 % full and never two quiet ticks (a guess at why, not seen: vLLM
    # preempts a running session when a chunk finds no block, and the recompute of a preempted
    # one lets tokens trickle out). So the claim is the silence and its cause; a stall, when
    # there is one, must come with time left in the run for the silence to show.
    assert s.silent_rate > 0.3, s
    assert s.silent_memory_frames >= 0.3 * s.frames, s
    if s.stalled:
        assert s.stall_at_s < cfg.duration_s - 2, s
