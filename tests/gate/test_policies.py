"""Gate policies: the paper's rules, validation, registry."""

import pytest

from selective_rollout.gate import (
    GATES,
    DivergenceTracker,
    Gate,
    GateDecision,
    GroupView,
    NoGate,
    OracleGate,
    PrefixEditGate,
    TwoAxisGate,
    build_gate,
    register_gate,
)

CONVERGED = [["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1"]] * 8
DIVERGENT = [["search(query)"], ["lookup(item)"], ["finish(answer)"]]


def test_identical_prefixes_fire_at_small_tau():
    gate = PrefixEditGate(k=3, tau=0.05)
    d = gate.decide(GroupView(CONVERGED, step=3))
    assert d.stop and d.features["prefix_edit_distance"] == 0.0


def test_divergent_group_does_not_fire():
    d = PrefixEditGate(k=1, tau=0.12).decide(GroupView(DIVERGENT, step=1))
    assert not d.stop and d.features["prefix_edit_distance"] > 0.5


def test_at_k_and_from_k_schedules():
    at_k = PrefixEditGate(k=10, tau=0.1, mode="at_k")
    from_k = PrefixEditGate(k=10, tau=0.1, mode="from_k")
    assert [s for s in range(1, 15) if at_k.should_check(s)] == [10]
    assert [s for s in range(1, 15) if from_k.should_check(s)] == [10, 11, 12, 13, 14]
    assert not any(NoGate().should_check(s) for s in range(1, 40))


def test_two_axis_or_rule():
    gate = TwoAxisGate(k=2, d_low=0.05, t_high=0.75)
    # divergent but 3 of 4 already ended by step 2 -> stops on the termination axis
    seqs = [["a"], ["b"], ["c"], ["d", "e"]]
    d = gate.decide(GroupView(seqs, step=2, ended=[True, True, True, False]))
    assert d.stop and "terminated" in d.reason
    # divergent and alive -> goes on
    d = gate.decide(GroupView([["a", "b"], ["c", "d"]], step=2, ended=[False, False]))
    assert not d.stop
    # converged -> stops on the distance axis
    assert gate.decide(GroupView([["a", "b"]] * 3, step=2)).stop


def test_oracle_uses_final_rewards_only():
    gate = OracleGate(k=5)
    assert gate.decide(GroupView(DIVERGENT, step=5, final_rewards=[0, 0, 0])).stop
    assert not gate.decide(GroupView(CONVERGED, step=5, final_rewards=[1] + [0] * 7)).stop
    with pytest.raises(ValueError, match="offline evaluation"):
        gate.decide(GroupView(CONVERGED, step=5))


def test_tracker_and_batch_agree_in_decide():
    tracker = DivergenceTracker(3)
    seqs = [["a", "b"], ["a", "c"], ["a", "b"]]
    for i, s in enumerate(seqs):
        for a in s:
            tracker.append(i, a)
    gate = PrefixEditGate(k=2, tau=0.5)
    with_tracker = gate.decide(GroupView(seqs, step=2, ended=[False] * 3, tracker=tracker))
    without = gate.decide(GroupView(seqs, step=2, ended=[False] * 3))
    assert with_tracker == without


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: PrefixEditGate(k=0, tau=0.1), "k must be"),
        (lambda: PrefixEditGate(k=10, tau=1.5), "tau must be <= 1.0"),
        (lambda: PrefixEditGate(k=10, tau=-0.1), "tau must be >= 0.0"),
        (lambda: PrefixEditGate(k=10, tau=0.1, mode="sometimes"), "mode"),
        (lambda: TwoAxisGate(k=10, d_low=0.1, t_high=2.0), "t_high"),
        (lambda: build_gate("nope"), "unknown gate 'nope'"),
        (lambda: GroupView([["a"]], step=1), "G >= 2"),
    ],
)
def test_bad_parameters_get_clear_errors(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_registry_makes_a_new_gate_one_class():
    assert {"none", "prefix_edit", "two_axis", "oracle"} <= set(GATES)

    @register_gate("always_test_only")
    class Always(Gate):
        def decide(self, group: GroupView) -> GateDecision:
            return GateDecision(True, "always")

    try:
        assert build_gate("always_test_only").decide(GroupView(DIVERGENT, step=1)).stop
        with pytest.raises(ValueError, match="registered twice"):
            register_gate("always_test_only")(Always)
    finally:
        GATES.remove("always_test_only")


def test_later_decision_steps_are_asked_too_and_checked() -> None:
    gate = PrefixEditGate(k=4, tau=0.1, steps=[8, 6])
    assert gate.decision_steps == [4, 6, 8]
    assert [s for s in range(1, 12) if gate.should_check(s)] == [4, 6, 8]
    with pytest.raises(ValueError, match="all > k=4"):
        PrefixEditGate(k=4, steps=[4])
    with pytest.raises(ValueError, match="needs mode=at_k"):
        PrefixEditGate(k=4, mode="from_k", steps=[6])


def test_observe_and_metrics_default_to_nothing() -> None:
    from selective_rollout.records import GroupRecord

    for name in ("none", "prefix_edit", "two_axis"):
        gate = build_gate(name)
        gate.observe(GroupRecord("g", "t", "x", []))
        assert gate.metrics() == {}


def test_the_former_name_of_the_gate_snapshot_still_imports_with_a_deprecation() -> None:
    import selective_rollout.gate as gate_package
    from selective_rollout.gate import GroupView, base

    for module in (gate_package, base):
        with pytest.warns(DeprecationWarning, match="GroupState is now GroupView"):
            assert module.GroupState is GroupView
