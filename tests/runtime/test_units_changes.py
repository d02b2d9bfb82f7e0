"""LiveChanges on its own: a request is validated at once, applied at the next tick; a KV
change is a future the ticks poll, one at a time, never holding the tick."""

import pytest
from runtime_factories import ScriptedEngine, config, control, gate, live, recorder

from engine.contract import KVPolicy
from runtime.changes import LiveChanges


def _changes(cfg=None, **engine_kw):
    cfg = cfg or config(policy="window", window=128, sinks=0, admission="aimd")
    engine = ScriptedEngine(policy=cfg.kv_policy(), **engine_kw)
    rec = recorder(cfg)
    state = live(cfg, engine.policy)
    g = gate(cfg, state=state)
    followed = []
    changes = LiveChanges(cfg, engine, rec, state,
                          on_policy=lambda: followed.append(engine.policy))
    changes.control = control(g, cfg)  # read by the tests: the sampler the run would have
    return changes, engine, rec, g, followed


@pytest.mark.parametrize("change, says", [
    ({"colour": "red"}, "unknown setting"),
    ({"target": 1.5}, "must be in (0, 1]"),
    ({"window": 16}, "smaller than one block"),
    ({"sinks": 128}, "must be smaller than the window"),
    ({"stall_guard": "yes"}, "must be true or false"),
    ({"limit": "bogus"}, "is not one of"),
])
def test_a_bad_request_is_refused_at_once_in_one_line(change, says):
    changes, engine, rec, _, _ = _changes()
    with pytest.raises(ValueError, match=None) as exc:
        changes.request(**change)
    assert says in str(exc.value) and "\n" not in str(exc.value)
    changes.apply_pending(0.1)
    assert rec.writer.rows["events"] == [] and engine.changes == []


def test_all_or_nothing_a_good_target_is_not_queued_beside_a_bad_window():
    changes, _, rec, _, _ = _changes()
    with pytest.raises(ValueError):
        changes.request(target=0.5, window=16)
    changes.apply_pending(0.1)
    assert changes.live.now.target == 0.8 and rec.writer.rows["events"] == []


def test_an_engine_that_cannot_change_kv_live_refuses_at_the_request():
    changes, *_ = _changes(live_policy=False)
    with pytest.raises(ValueError, match="cannot change W or S while running"):
        changes.request(window=64)


def test_instant_changes_apply_at_the_next_tick_and_are_on_the_record():
    changes, _, rec, g, _ = _changes()
    said = changes.request(target=0.5, stall_guard=True)
    assert "applied at the next tick" in said
    assert changes.live.now.target == 0.8  # not before the tick
    changes.apply_pending(0.4)
    now = changes.live.now
    assert now.target == 0.5 and now.stall_guard and g.limit.config.target_fraction == 0.5
    assert [e["setting"] for e in rec.writer.events("param_change")] == ["target",
                                                                          "stall_guard"]
    assert [h["setting"] for h in changes.history] == ["target", "stall_guard"]
    assert [r["setting"] for r in rec.writer.rows["settings_history"]] == ["target",
                                                                            "stall_guard"]


def test_a_limit_swap_reaches_the_gate_and_the_windowed_limit():
    changes, _, _, g, _ = _changes()
    changes.request(limit="fixed", limit_params={"limit": 3})
    changes.apply_pending(0.1)
    # One owner: the live settings hold the new limit, and the gate and the sampler read it.
    assert changes.live.now.limit.kind == "fixed" and changes.live.now.limit.limit == 3
    assert g.limit is changes.live.now.limit and changes.control.inner is g.limit


def test_a_kv_change_does_not_hold_the_tick_and_lands_when_the_engine_confirms():
    changes, engine, rec, _, followed = _changes()
    changes.request(window=64)
    changes.apply_pending(1.0)  # started: the engine has it, the tick goes on
    assert [p for p, _ in engine.changes] == [KVPolicy("window", 64, 0)]
    assert rec.writer.events("param_change") == [] and followed == []
    changes.apply_pending(1.08)  # not yet confirmed: nothing to record
    engine.resolve(True)
    changes.apply_pending(1.16)
    (event,) = rec.writer.events("param_change")
    assert event["change"] == "W 128 → 64" and event["requested_t"] == 1.0 and event["t"] == 1.16
    assert 0 <= event["confirm_ms"] < 1e3  # from the start to the engine's confirmation
    assert followed == [KVPolicy("window", 64, 0)]


def test_kv_changes_go_one_at_a_time_each_building_on_the_one_ahead():
    changes, engine, rec, _, _ = _changes()
    changes.request(window=64)
    changes.apply_pending(1.0)
    changes.request(sinks=32)  # built on W=64 (under way), not on the engine's W=128
    changes.request(target=0.6)
    changes.apply_pending(1.08)
    assert len(engine.changes) == 1 and changes.live.now.target == 0.6  # the target did not wait
    engine.resolve(True)
    changes.apply_pending(1.16)  # the first lands, the second starts
    assert [p for p, _ in engine.changes] == [KVPolicy("window", 64, 32)]


def test_a_refused_kv_change_leaves_the_old_policy_and_says_why():
    changes, engine, rec, _, followed = _changes()
    changes.request(window=64)
    changes.apply_pending(1.0)
    engine.resolve(False)
    changes.apply_pending(1.08)
    (rejected,) = rec.writer.events("param_rejected")
    assert rejected["reason"] == "RuntimeError: the engine refused it"
    assert rejected["setting"] == "policy"
    assert engine.policy.window_tokens == 128 and followed == []


def test_a_kv_change_refused_when_it_starts_is_on_the_record_not_raised():
    changes, engine, rec, _, _ = _changes()
    changes.request(window=64)
    engine.refuse_at_once = "pool too small for W=64"
    changes.apply_pending(1.0)
    (rejected,) = rec.writer.events("param_rejected")
    assert rejected["reason"] == "ValueError: pool too small for W=64"


def test_settle_waits_for_the_change_under_way():
    changes, engine, rec, _, _ = _changes()
    changes.request(window=64)
    changes.apply_pending(1.0)
    engine.resolve(True)  # confirmed after the last tick
    changes.settle(4.0)
    assert rec.writer.events("param_change")[0]["t"] == 4.0
    assert changes.live.now.summary_values()["window"] == 64
