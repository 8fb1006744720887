"""GateWatch: the one schedule of gate questions shared by the coordinator's groups and LiveGroup."""

from __future__ import annotations

import pytest

from selective_rollout.gate import GateDecision, GateWatch, GroupView, PrefixEditGate, prefix_edit_distance


class CountingGate(PrefixEditGate):
    """The paper's gate, remembering the steps it was asked at."""

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.asked: list[int] = []

    def decide(self, group: GroupView) -> GateDecision:
        self.asked.append(group.step)
        return super().decide(group)


def test_at_k_asks_once_at_k_when_every_live_trajectory_got_there() -> None:
    gate = CountingGate(k=2, tau=0.0)  # never stops: every question shows
    watch = GateWatch(gate, g=3)
    for s in range(4):
        for i in range(3):
            watch.act(i, f"go to {i}-{s}")
            if s == 1 and i < 2:
                assert gate.asked == []  # trajectory 2 has one action: D_2 is not defined yet
    assert gate.asked == [2]
    assert watch.decision is not None and watch.decision.step == 2 and not watch.fired


def test_from_k_asks_at_every_step_from_k_until_it_stops() -> None:
    gate = CountingGate(k=2, tau=0.4, mode="from_k")
    watch = GateWatch(gate, g=3)
    plays = [["a", "b", "c", "d", "e"], ["x", "b", "c", "d", "e"], ["y", "b", "c", "d", "e"]]
    fired = []
    for s in range(5):
        for i in range(3):
            stop = watch.act(i, plays[i][s])
            if stop is not None:
                fired.append(stop.step)
    # D_2 = 1/2, D_3 = 1/3 < 0.4: stopped at 3 and never asked again
    assert gate.asked == [2, 3] and fired == [3] and watch.fired and watch.decision.step == 3
    assert watch.decision.features["prefix_edit_distance"] == pytest.approx(1 / 3)


def test_trajectories_that_end_before_k_are_padded_and_a_group_over_before_k_is_never_asked() -> None:
    gate = CountingGate(k=3, tau=0.5)
    watch = GateWatch(gate, g=3)
    watch.act(0, "look", ended=True)  # ended at step 1: END-padded from now on
    for s in range(3):
        for i in (1, 2):
            watch.act(i, "look" if s == 0 else "go")
    assert gate.asked == [3]
    state = GroupView(
        [["look"], ["look", "go", "go"], ["look", "go", "go"]], step=3, ended=[True, False, False]
    )
    assert watch.decision.features["prefix_edit_distance"] == prefix_edit_distance(
        state.actions, 3, state.ended
    )

    short = CountingGate(k=3, tau=0.5)
    over = GateWatch(short, g=2)
    over.act(0, "look", ended=True)
    over.act(1, "look")
    assert over.act(1, "go", ended=True) is None
    assert short.asked == [] and over.decision is None  # everyone ended before K: nothing to save


def test_describe_logs_every_feature_and_the_decision_is_final() -> None:
    watch = GateWatch(CountingGate(k=1, tau=0.5), g=2, describe=True)
    watch.act(0, "look")
    stop = watch.act(1, "look")
    assert stop is not None and stop.stop and stop.step == 1
    assert {"prefix_edit_distance", "termination_frac"} <= set(stop.features)
    assert watch.act(0, "go") is None and watch.decision is stop  # fired once: never asked again


def test_a_single_trajectory_is_never_asked_and_an_ended_one_takes_no_action() -> None:
    gate = CountingGate(k=1, tau=1.0)
    single = GateWatch(gate, g=1)
    assert single.act(0, "look") is None and gate.asked == []
    watch = GateWatch(CountingGate(k=5), g=2)
    watch.act(0, "look", ended=True)
    assert watch.end(0) is None  # ending twice is a no-op
    with pytest.raises(ValueError, match="has ended"):
        watch.act(0, "go")


def test_the_task_id_and_type_reach_the_gate() -> None:
    seen = []

    class TaskGate(PrefixEditGate):
        def decide(self, group: GroupView) -> GateDecision:
            seen.append((group.task_id, group.task_type))
            return super().decide(group)

    watch = GateWatch(TaskGate(k=1, tau=0.0), g=2, task_id="kitchen-7", task_type="cool")
    watch.act(0, "look")
    watch.act(1, "look")
    assert seen == [("kitchen-7", "cool")]


def test_holds_a_trajectory_at_each_decision_step_until_the_gate_was_asked() -> None:
    watch = GateWatch(CountingGate(k=2, tau=0.0, steps=[4]), g=2)  # never stops
    watch.act(0, "a")
    assert not watch.holds(0)  # step 1: no decision there
    watch.act(0, "b")
    assert watch.holds(0) and not watch.holds(1)  # 0 waits at K for 1, which is not at K yet
    watch.act(1, "a")
    watch.act(1, "b")  # both at K: asked
    assert not watch.holds(0) and not watch.holds(1)
    watch.act(0, "c")
    watch.act(0, "d")
    assert watch.holds(0)  # the later decision step too
    watch.act(1, "c")
    watch.act(1, "d", ended=True)  # the slow one ends there: the question is asked, nobody waits
    assert not watch.holds(0) and watch.gate.asked == [2, 4]


def test_holds_nothing_after_a_stop_nor_under_from_k() -> None:
    stopping = GateWatch(CountingGate(k=1, tau=1.0), g=2)
    stopping.act(0, "a")
    stopping.act(1, "a")  # D_1 = 0 < 1: stopped (an audit would let it run on)
    stopping.act(0, "b")
    assert stopping.fired and not stopping.holds(0) and not stopping.holds(1)
    from_k = GateWatch(CountingGate(k=1, tau=0.0, mode="from_k"), g=2)
    from_k.act(0, "a")
    assert not from_k.holds(0)
