"""A gate's step chosen online from the run's labelled groups (``stalled`` with ``online``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from selective_rollout.gate import build_gate
from selective_rollout.records import GateRecord, Outcome
from tests.gate.synthetic import group

LONG = [f"a{s}" for s in range(10)]


def _fail(i: int):
    """All-fail: four trajectories that run all 10 steps (no success, so none finishes early)."""
    return group(f"f{i}", [LONG] * 4, [0, 0, 0, 0])


def _late(i: int, winner_at: int = 9):
    """Mixed: the winner finishes at ``winner_at``, the others run 10 steps (none done before)."""
    return group(f"m{i}", [LONG[:winner_at], LONG, LONG, LONG], [1, 0, 0, 0])


def test_the_prior_holds_until_the_evidence_moves_it_earlier() -> None:
    gate = build_gate("stalled", k=8, online=[4, 9])
    assert gate.decision_steps == [8] and gate.should_check(8) and not gate.should_check(4)
    for i in range(10):  # too few to support any step at a 0.9 lower bound
        gate.observe(_fail(i))
    assert gate.decision_steps == [8]
    for i in range(10, 40):  # every stop the rule would make is right, at every step
        gate.observe(_fail(i))
    assert gate.decision_steps == [4] and gate.should_check(4) and not gate.should_check(8)
    m = gate.metrics()
    assert m["step"] == 4 and m["step_labelled"] == 40 and m["step_precision_low"] >= 0.9
    assert gate.online.changes[0] == (0, 8) and gate.online.changes[-1][1] == 4


def test_evidence_against_the_prior_moves_the_step_later_and_none_precise_turns_it_off() -> None:
    gate = build_gate("stalled", k=6, online=[4, 9])
    for i in range(30):  # 6 of 10 right before step 9 (the late winners look stalled), 6 of 6 from 9
        gate.observe(_fail(i) if i % 10 < 6 else _late(i))
    assert gate.decision_steps == [9]
    off = build_gate("stalled", k=6, online=[4, 9])
    for i in range(30):  # winners that finish on the last step look stalled at every candidate
        off.observe(_fail(i) if i % 10 < 6 else _late(i, winner_at=10))
    assert off.decision_steps == [] and not any(off.should_check(s) for s in range(12))
    assert off.metrics()["step"] == -1


def test_only_groups_with_known_final_rewards_count() -> None:
    gate = build_gate("stalled", k=8, online=[4, 9])
    for i in range(40):  # cut and never audited: their trajectories carry no final reward
        record = _fail(i)
        cut = [replace(t, reward=None) for t in record.trajectories]
        gate.observe(replace(record, outcome=Outcome.CUT, trajectories=cut))
    assert gate.metrics()["step_labelled"] == 0 and gate.decision_steps == [8]


def test_the_online_range_must_hold_k_and_a_single_step() -> None:
    with pytest.raises(ValueError, match="first <= k=11 <= last"):
        build_gate("stalled", k=11, online=[4, 9])
    with pytest.raises(ValueError, match="one step"):
        build_gate("stalled", k=6, online=[4, 9], steps=[8])
    assert build_gate("stalled", k=6).online is None


def test_cut_groups_count_at_earlier_steps_with_the_audited_share_standing_for_their_class() -> None:
    """The step in force is 8 and its stops are right. The uncut groups include late winners
    (won at 7: uncut at 8, stalled at 4-6), so counting labelled groups alone an earlier step
    looks imprecise (50 right of 56); the cut groups, stalled at 4-6 too and as right as their
    audits, are counted there as well and move the step to 4."""
    gate = build_gate("stalled", k=8, online=[4, 9])
    cut_at_8 = GateRecord(8, True, "stalled")
    for i in range(350):
        record = _fail(i)
        if i % 7:  # cut at 8, not audited: no rewards, trajectories end at the cut
            cut = [replace(t, reward=None, steps=t.steps[:8]) for t in record.trajectories]
            gate.observe(replace(record, outcome=Outcome.CUT, trajectories=cut, gate=cut_at_8))
        else:  # audited: ran on, all failed
            gate.observe(replace(record, outcome=Outcome.AUDITED, gate=cut_at_8))
    for i in range(6):
        gate.observe(_late(i, winner_at=7))
    assert gate.online.audited == 50 and gate.online.unlabelled[4] == 300 and gate.online.cut[4] == 56
    assert gate.decision_steps == [4]
