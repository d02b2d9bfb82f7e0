"""WAV sessions drive the runtime like the synthetic load (twin engine: fast twin of
test_wav_run_vllm.py)."""

import math

from engine.twin import CostModel, TwinEngine
from load_gen.tokenizer import FrameTokenizer
from load_gen.wav import load_folder
from runtime import RunConfig, Runner
from store.queries import occupancy

# open_budget 8: all six start in the first frames, as the fixed load they are compared with
# (a wav load's session 0 starts a tick before the rest, so the default budget of 2 per tick
# would start sessions 3-5 one and two ticks later: that is tests/runtime's subject, not this).
SETTINGS = dict(engine="twin", model="tiny", policy="window", window=128, pool_blocks=64,
                frame_ms=160.0, duration_s=4.0, sessions=6, open_budget=8)


class RecordingTwin(TwinEngine):
    """The twin, keeping what each session was sent (to check the runtime sends audio tokens)."""

    def __init__(self, config):
        super().__init__(config, CostModel())
        self.sent: dict[int, list[list[int]]] = {}

    def submit(self, session_id, token_ids, max_new):
        self.sent.setdefault(session_id, []).append(list(token_ids))
        return super().submit(session_id, token_ids, max_new)


def _frames_per_session(store, run_id) -> dict[int, int]:
    rows = store.cursor().execute(
        "SELECT session_id, count(*) FROM frames WHERE run_id = ? GROUP BY 1", [run_id]).fetchall()
    return dict(rows)


def test_looping_wav_sessions_run_like_synthetic_ones(store, speech):
    wav_cfg = RunConfig(load="wav", wav_dir=str(speech["dir"]), **SETTINGS)
    engine = RecordingTwin(wav_cfg.engine_config())
    s = Runner(wav_cfg, engine, store).run()
    synthetic = Runner(RunConfig(load="fixed", **SETTINGS), TwinEngine(
        wav_cfg.engine_config(), CostModel()), store).run()
    assert s.status == synthetic.status == "finished", s.reason
    assert s.sessions_offered == s.admitted == 6 and not s.stalled
    assert s.silent_frames == synthetic.silent_frames == 0
    assert s.on_time_rate == synthetic.on_time_rate == 1.0
    assert s.max_resident_blocks == synthetic.max_resident_blocks <= 5
    # Arrivals are phase-staggered within the first period; without --stagger the runtime
    # starts them at the next tick: session 0 at 0 s (25 frames), the others at 0.16 s (24).
    assert _frames_per_session(store, s.run_id) == {0: 25, 1: 24, 2: 24, 3: 24, 4: 24, 5: 24}
    assert s.frames == 145 and synthetic.frames == 150
    assert len(occupancy(store.cursor(), s.run_id)) == 25  # one tick row per period
    # What the engine got is the tokenized audio of the session's file, frame after frame.
    clips = load_folder(str(speech["dir"]), 16000)
    tok = FrameTokenizer(16000, 160.0, 16, engine.vocab_size)
    for session_id in (0, 4):
        clip = clips[session_id % len(clips)]
        first = tok.tokenize(clip.samples[:2560]).tolist()
        second = tok.tokenize(clip.samples[2560:5120]).tolist()
        assert engine.sent[session_id][:2] == [first, second]


def test_without_looping_a_session_ends_with_its_file(store, speech):
    cfg = RunConfig(load="wav", wav_dir=str(speech["dir"]), wav_loop=False,
                    **{**SETTINGS, "stagger": True})
    s = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store).run()
    assert s.status == "finished" and s.silent_frames == 0
    clips = load_folder(str(speech["dir"]), 16000)
    per_session = _frames_per_session(store, s.run_id)
    for session_id in range(6):
        file_frames = math.ceil(len(clips[session_id % 3].samples) / 2560)
        # With --stagger session i starts at i/6 of a period: session 0 fits 25 frames in the
        # 4 s run, the others 24 before the run's end cuts their last one.
        run_frames = 25 if session_id == 0 else 24
        assert per_session[session_id] == min(file_frames, run_frames), session_id
    assert per_session[2] == per_session[5] < 24  # c_hello.wav ended its sessions early
