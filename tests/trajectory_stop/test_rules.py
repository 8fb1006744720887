"""The shipped trajectory stop rules' decisions, their parameters and the registry entries."""

from __future__ import annotations

import pytest

from selective_rollout.trajectory_stop import NoStop, TrajectoryRule, TrajectoryView
from selective_rollout.trajectory_stop.base import TRAJECTORY_STOPS
from selective_rollout.trajectory_stop.looping import LoopingRule
from selective_rollout.trajectory_stop.outlived import OutlivedRule


def view(index: int, actions: list[list[str]], won: list[bool], step: int | None = None) -> TrajectoryView:
    ended = [w for w in won]
    step = len(actions[index]) if step is None else step
    return TrajectoryView(index, step, actions, won, ended, len(actions))


WANDER = [f"go to place {s}" for s in range(8)]


def test_outlived_stops_a_wanderer_once_a_sibling_has_won() -> None:
    rule = OutlivedRule(min_step=6)
    actions = [WANDER[:3], WANDER, WANDER]
    assert rule.decide(view(1, actions, [True, False, False])) == 0.0
    assert rule.decide(view(1, actions, [False, False, False])) is None  # nobody has won yet
    assert rule.decide(view(0, actions, [True, False, False])) is None  # the winner itself


def test_outlived_waits_for_min_winners_and_assigns_its_reward() -> None:
    rule = OutlivedRule(min_winners=2, assign=-0.5)
    actions = [WANDER] * 4
    assert rule.decide(view(3, actions, [True, False, False, False])) is None
    assert rule.decide(view(3, actions, [True, True, False, False])) == -0.5


def test_min_step_is_when_a_rule_becomes_due() -> None:
    rule = OutlivedRule(min_step=4)
    assert [rule.due(s) for s in (1, 3, 4, 9)] == [False, False, True, True]
    assert not any(NoStop().due(s) for s in range(1, 20))
    assert NoStop().decide(view(1, [WANDER] * 2, [True, False])) is None


@pytest.mark.parametrize(
    ("last", "stops"),
    [
        (["go to desk 1", "go to desk 2"] * 3, True),  # two commands, over and over
        (["look"] * 6, True),
        (["go to desk 1", "go to desk 2", "go to desk 3"] * 2, False),  # three distinct: exploring
        (["go to desk 1", "go to desk 2"] * 2 + ["open drawer 1", "go to desk 1"], False),
    ],
)
def test_looping_stops_a_trajectory_cycling_through_few_commands(last: list[str], stops: bool) -> None:
    rule = LoopingRule(window=6, max_distinct=2, min_step=6)
    actions = [["take apple 1", "go to fridge 1", *last], WANDER]
    assert rule.decide(view(0, actions, [False, False])) == (0.0 if stops else None)


def test_looping_reads_only_the_actions_up_to_the_step_asked_about() -> None:
    rule = LoopingRule(window=4, max_distinct=1, assign=0.25)
    actions = [["look"] * 4 + ["go to desk 1"], WANDER]
    assert rule.decide(view(0, actions, [False, False], step=4)) == 0.25
    assert rule.decide(view(0, actions, [False, False], step=5)) is None
    assert rule.decide(view(0, actions, [False, False], step=3)) is None  # fewer than window actions


def test_a_view_must_describe_the_whole_group() -> None:
    with pytest.raises(ValueError, match="2 won flags"):
        TrajectoryView(0, 1, [["a"]] * 3, [False, False], [False] * 3, 3)
    with pytest.raises(ValueError, match="not one of the group's 3"):
        TrajectoryView(3, 1, [["a"]] * 3, [False] * 3, [False] * 3, 3)


def test_rules_are_registered_and_built_from_their_params() -> None:
    assert {"none", "outlived", "looping"} <= set(TRAJECTORY_STOPS)
    rule = TRAJECTORY_STOPS.build("looping", {"window": 3, "min_step": 5})
    assert isinstance(rule, LoopingRule) and rule.name == "looping"
    assert (rule.params.window, rule.params.min_step, rule.params.max_distinct) == (3, 5, 2)
    assert isinstance(TRAJECTORY_STOPS.build("none"), NoStop)
    with pytest.raises(ValueError, match=r"unknown trajectory stop 'outlivd' \(did you mean 'outlived'\?\)"):
        TRAJECTORY_STOPS.get("outlivd")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"min_winners": 0}, "trajectory stop 'outlived': min_winners must be >= 1 (got 0)"),
        (
            {"window": 3},
            "trajectory stop 'outlived' has no parameter 'window' (it has: min_step, min_winners, assign)",
        ),
        (
            {"assign": float("inf")},
            "trajectory stop 'outlived': assign: Input should be a finite number (got inf)",
        ),
    ],
)
def test_a_rule_built_in_code_names_its_bad_parameter_in_one_line(values: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        TRAJECTORY_STOPS.get("outlived")(**values)  # as loaded by the registry, which names it
    assert str(info.value) == message


def test_a_rule_may_not_own_a_parameter_called_name() -> None:
    from pydantic import Field

    from selective_rollout.trajectory_stop import TrajectoryStopParams

    class Named(TrajectoryStopParams):
        name: str = Field("x")

    class Bad(TrajectoryRule):
        Params = Named

    with pytest.raises(TypeError, match="cannot be called 'name'"):
        TRAJECTORY_STOPS.register("bad_test_only")(Bad)
    assert "bad_test_only" not in TRAJECTORY_STOPS
