"""The stalled gate: stop a group none (or few) of whose trajectories has finished by step K."""

from __future__ import annotations

import pytest

from selective_rollout.analysis.gate_eval.replay import ReplayCalibration
from selective_rollout.gate import GroupView, build_gate
from selective_rollout.gate.stalled import StalledGate
from tests.gate.synthetic import group

LONG = [f"a{s}" for s in range(10)]


def _state(lengths: list[int], step: int = 6, ended: list[bool] | None = None) -> GroupView:
    """A converged group whose trajectory i has taken ``lengths[i]`` actions (ended ones END-padded)."""
    acts = [LONG[:n] for n in lengths]
    return GroupView(acts, step=step, ended=ended if ended is not None else [n < step for n in lengths])


def test_it_stops_a_group_none_of_which_has_finished_and_only_that() -> None:
    gate = build_gate("stalled", k=6)
    stop = gate.decide(_state([6, 6, 6, 6]))
    assert stop.stop and stop.features["termination_frac"] == 0.0
    one_done = gate.decide(_state([4, 6, 6, 6]))
    assert not one_done.stop and one_done.features["termination_frac"] == 0.25
    # its decision reads the end flags, not the actions: the same actions with nobody ended stop
    assert gate.decide(_state([6, 6, 6, 6], ended=[False] * 4)).stop
    assert not gate.decide(_state([6, 6, 6, 6], ended=[True, False, False, False])).stop


def test_the_threshold_lets_a_few_finished_trajectories_stop_too_and_below_zero_turns_it_off() -> None:
    state = _state([3, 6, 6, 6])  # a quarter finished
    assert not build_gate("stalled", k=6, max_finished_frac=0.2).decide(state).stop
    assert build_gate("stalled", k=6, max_finished_frac=0.25).decide(state).stop
    off = build_gate("stalled", k=6, max_finished_frac=-1.0)
    assert not off.decide(_state([6, 6, 6, 6])).stop
    with pytest.raises(ValueError, match="max_finished_frac"):
        build_gate("stalled", max_finished_frac=1.5)


def test_a_trajectory_that_ends_after_k_has_not_finished_by_k() -> None:
    """Offline (no end flags) a logged trajectory longer than K had not ended at K."""
    gate = build_gate("stalled", k=4)
    assert gate.decide(GroupView([LONG[:8]] * 4, step=4)).stop
    assert not gate.decide(GroupView([LONG[:4], *[LONG[:8]] * 3], step=4)).stop


def _log(n: int, late_success: int, winner_at: int = 9) -> list:
    """``n`` all-fail groups that run 10 steps, and ``late_success`` mixed ones whose winner
    finishes only at step ``winner_at`` (no trajectory done by K = 6 in either)."""
    fails = [group(f"f{i}", [LONG] * 4, [0, 0, 0, 0]) for i in range(n)]
    late = [group(f"m{i}", [LONG[:winner_at], LONG, LONG, LONG], [1, 0, 0, 0]) for i in range(late_success)]
    return fails + late


def test_calibration_picks_the_step_where_it_is_precise_and_turns_off_where_none_is() -> None:
    cal = ReplayCalibration(0.9, shared={"k": 6})
    assert StalledGate.calibrate(_log(9, 0), cal) == {"k": 6, "max_finished_frac": 0.0}  # 9 of 9 right
    # at K = 6 only 6 of 10 stops are right; by step 9 the late winners have finished: 6 of 6
    assert StalledGate.calibrate(_log(6, 4), cal) == {"k": 9, "max_finished_frac": 0.0}
    # with later decision steps in the schedule K stays where it is (the steps must follow it)
    with_steps = ReplayCalibration(0.9, shared={"k": 6, "mode": "at_k", "steps": [7]})
    assert StalledGate.calibrate(_log(6, 4), with_steps) == {"max_finished_frac": -1.0}
    # winners that finish on the last step look stalled at every step before it: off
    assert StalledGate.calibrate(_log(6, 4, winner_at=10), cal) == {"max_finished_frac": -1.0}
