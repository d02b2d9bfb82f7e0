import pytest

from load_gen.synthetic import LoadConfig, SyntheticFrames, arrival_times


def test_fixed_ramp_and_poisson_arrivals():
    assert arrival_times(LoadConfig("fixed", sessions=3)) == [0.0, 0.0, 0.0]
    assert arrival_times(LoadConfig("ramp", sessions=4, arrival_rate=2.0)) == [0, 0.5, 1.0, 1.5]
    a = arrival_times(LoadConfig("poisson", sessions=50, arrival_rate=5.0, duration_s=100, seed=3))
    b = arrival_times(LoadConfig("poisson", sessions=50, arrival_rate=5.0, duration_s=100, seed=3))
    c = arrival_times(LoadConfig("poisson", sessions=50, arrival_rate=5.0, duration_s=100, seed=4))
    assert a == b and a != c and len(a) == 50 and a == sorted(a)
    assert 5 < a[-1] < 20  # 50 arrivals at 5/s take about 10 s


def test_arrivals_stop_at_the_end_of_the_run():
    times = arrival_times(LoadConfig("ramp", sessions=100, arrival_rate=1.0, duration_s=10))
    assert len(times) == 10


def test_frames_are_seeded_and_avoid_the_special_token():
    f1, f2 = SyntheticFrames(7, 100, 16), SyntheticFrames(7, 100, 16)
    frames = [f1.next_frame(0.08) for _ in range(50)]
    assert frames == [f2.next_frame(0.08) for _ in range(50)]
    assert all(len(f.token_ids) == 16 and 0 not in f.token_ids and max(f.token_ids) < 100
               for f in frames)
    assert frames[10].t_media_s == 10 * 0.08 and frames[0].voice_active


@pytest.mark.parametrize("kwargs, match", [
    ({"kind": "burst"}, "load 'burst'"), ({"sessions": 0}, "sessions 0"),
    ({"duration_s": 0}, "duration 0"), ({"kind": "poisson"}, "arrival-rate"),
    ({"arrival_rate": -1.0}, "arrival rate -1.0"), ({"session_s": 0.0}, "session length 0.0"),
])
def test_bad_load_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoadConfig(**kwargs)
