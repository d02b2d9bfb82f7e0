"""Placement across data-parallel ranks: count balances sessions, headroom balances how soon
each pool fills."""

import math

import pytest

from control.placement import Placer, RankLoad, predicted_plateau, t_sat_with_one_more_s

G = 0.1  # ρ/s one unbounded session adds to its rank's pool


def test_count_takes_the_rank_with_fewest_sessions_and_rotates_ties():
    placer = Placer("count")
    loads = [RankLoad(0, 0.9, 1), RankLoad(1, 0.1, 2)]
    assert placer.choose(loads, G) == 0  # blind to the full pool: what vLLM's balancer does
    empty = [RankLoad(0, 0.0, 0), RankLoad(1, 0.0, 0), RankLoad(2, 0.0, 0)]
    assert [placer.choose(empty, G) for _ in range(3)] == [1, 2, 0]  # ties rotate


def test_headroom_takes_the_pool_that_fills_last_with_one_more_session():
    # Rank 0: one old session holding 0.6; rank 1: two young ones at 0.1 in all.
    loads = [RankLoad(0, 0.6, 1), RankLoad(1, 0.1, 2)]
    assert t_sat_with_one_more_s(loads[0], G, None) == pytest.approx(0.4 / (2 * G))
    assert t_sat_with_one_more_s(loads[1], G, None) == pytest.approx(0.9 / (3 * G))
    assert Placer("headroom").choose(loads, G) == 1
    assert Placer("count").choose(loads, G) == 0


def test_headroom_never_picks_a_full_rank_while_another_has_room():
    loads = [RankLoad(0, 1.0, 0), RankLoad(1, 0.7, 5)]
    assert Placer("headroom").choose(loads, G) == 1
    assert t_sat_with_one_more_s(loads[0], G, None) == 0.0


def test_a_steeper_fitted_slope_counts_a_flatter_one_does_not():
    steep = RankLoad(0, 0.5, 1, slope_per_s=0.5)
    assert t_sat_with_one_more_s(steep, G, None) == pytest.approx(0.5 / (0.5 + G))
    # Sessions that just closed pull the slope down; the ones that stay still grow.
    shrinking = RankLoad(0, 0.5, 2, slope_per_s=-0.3)
    assert t_sat_with_one_more_s(shrinking, G, None) == pytest.approx(0.5 / (3 * G))


def test_bounded_kv_places_by_predicted_plateau():
    share = 0.1  # each windowed session settles at a tenth of a pool
    loads = [RankLoad(0, 0.45, 3), RankLoad(1, 0.2, 4)]  # rank 1: more sessions, still filling
    assert predicted_plateau(loads[0], share) == pytest.approx(0.55)
    assert predicted_plateau(loads[1], share) == pytest.approx(0.5)
    assert t_sat_with_one_more_s(loads[0], G, share) == math.inf
    assert Placer("headroom").choose(loads, G, share) == 1
    assert t_sat_with_one_more_s(RankLoad(0, 0.2, 9), G, share) == 0.0  # 10 × 0.1 = full


def test_misuse_is_named():
    with pytest.raises(ValueError, match="placement 'random' is not one of engine, count"):
        Placer("random")
    with pytest.raises(ValueError, match="leaves the choice to the engine"):
        Placer("engine").choose([RankLoad(0, 0.0, 0)])
    with pytest.raises(ValueError, match=r"rank 1 occupancy 1.5 must be in \[0, 1\]"):
        RankLoad(1, 1.5, 0)
    with pytest.raises(ValueError, match="no ranks"):
        Placer("count").choose([])
    assert not Placer("engine").pins and Placer("headroom").pins
