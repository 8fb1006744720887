"""The group lifecycle: its moves, the verdict it settles, and its agreement with logged records.

tests/fixtures/rollouts_v1.jsonl was written by the coordinator before the lifecycle existed (the
scripted doubles of test_coordinator_unit.py, one group of every outcome): it must still read, and
what the lifecycle decides for each of its groups must be what the log says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selective_rollout.lifecycle import GroupLifecycle, GroupPhase, Verdict
from selective_rollout.records import GroupRecord, Outcome, read_groups

V1_LOG = Path(__file__).resolve().parent / "fixtures" / "rollouts_v1.jsonl"

# (outcome, zero_variance, trained_on) of each group of the fixture, in order
V1_GROUPS = [
    (Outcome.CUT, None, False),
    (Outcome.COMPLETED, False, True),
    (Outcome.AUDITED, False, True),  # a false stop, run to the end by the audit: trained on
    (Outcome.AUDITED, True, False),
    (Outcome.FILTERED, True, False),
    (Outcome.COMPLETED, False, True),
    (Outcome.FAILED, None, False),  # a bad game
    (Outcome.FAILED, None, False),  # a dead env worker, then its retry
    (Outcome.COMPLETED, True, True),
    (Outcome.SKIPPED, None, False),  # the bad game, from then on
    (Outcome.COMPLETED, False, True),
    (Outcome.COMPLETED, True, True),
    (Outcome.SKIPPED, None, False),  # by the strategy (preskip)
    (Outcome.COMPLETED, False, True),
    (Outcome.FAILED, None, False),  # an engine request failed mid-trajectory
    (Outcome.COMPLETED, False, True),
]


def _keep_all(zero_variance: bool) -> bool:
    return True


def _drop_zero_variance(zero_variance: bool) -> bool:
    return not zero_variance


def _cut(audit: bool) -> GroupLifecycle:
    life = GroupLifecycle()
    life.gate_fired()
    life.audit_decided(audit)
    return life


def test_a_group_the_gate_never_stops_finishes_and_the_strategy_decides():
    life = GroupLifecycle()
    life.trajectories_ended()
    assert life.phase is GroupPhase.FINISHED and not life.stopped
    assert life.settle([1.0, 0.0], _drop_zero_variance) == Verdict(Outcome.COMPLETED, False)
    assert life.settle([0.0, 0.0], _drop_zero_variance) == Verdict(Outcome.FILTERED, True)
    assert life.settle([0.0, 0.0], _keep_all) == Verdict(Outcome.COMPLETED, True)


def test_a_stop_goes_through_the_gate_to_cut_or_audited():
    cut = _cut(audit=False)
    assert cut.trail == [GroupPhase.RUNNING, GroupPhase.AT_GATE, GroupPhase.CUT] and cut.stopped
    verdict = cut.settle([0.0, 1.0], _keep_all)
    assert verdict == Verdict(Outcome.CUT, None) and not verdict.trained
    audited = _cut(audit=True)
    assert not audited.stopped and audited.audit_chosen
    audited.trajectories_ended()  # it ran on to the end: still audited
    assert audited.phase is GroupPhase.AUDITED
    informative = audited.settle([0.0, 1.0], lambda zero: pytest.fail("keep asked for an audited group"))
    assert informative == Verdict(Outcome.AUDITED, False) and informative.trained
    assert not audited.settle([1.0, 1.0], _keep_all).trained


def test_a_failure_keeps_its_reason_and_whether_the_audit_chose_the_group():
    life = _cut(audit=True)
    life.fail("env worker died")
    assert life.phase is GroupPhase.FAILED and life.failure == "env worker died" and life.audit_chosen
    assert life.settle([], _keep_all) == Verdict(Outcome.FAILED, None)
    cut = _cut(audit=False)
    cut.fail("engine 0 died")  # a trajectory failed before the cut group was cancelled
    assert cut.settle([], _keep_all).outcome is Outcome.FAILED and not cut.audit_chosen


@pytest.mark.parametrize(
    "moves",
    [
        pytest.param([lambda g: g.trajectories_ended(), lambda g: g.gate_fired()], id="finished-stopped"),
        pytest.param([lambda g: g.audit_decided(True)], id="audit-without-a-stop"),
        pytest.param([lambda g: g.trajectories_ended(), lambda g: g.fail("why")], id="finished-then-failed"),
        pytest.param([lambda g: g.fail("why"), lambda g: g.fail("why")], id="failed-twice"),
    ],
)
def test_an_impossible_move_is_an_error(moves):
    life = GroupLifecycle()
    *possible, impossible = moves
    for move in possible:
        move(life)
    with pytest.raises(RuntimeError, match="a group cannot go from"):
        impossible(life)


@pytest.mark.parametrize("state", ["running", "at gate"])
def test_a_group_still_playing_has_no_verdict(state):
    life = GroupLifecycle()
    if state == "at gate":
        life.gate_fired()
    with pytest.raises(RuntimeError, match="has no verdict yet"):
        life.settle([0.0], _keep_all)


def test_every_outcome_trains_by_one_rule():
    trains = {(o, z): o.trains(z) for o in Outcome for z in (None, False, True)}
    assert {key for key, yes in trains.items() if yes} == {
        (Outcome.COMPLETED, None),
        (Outcome.COMPLETED, False),
        (Outcome.COMPLETED, True),
        (Outcome.AUDITED, False),
    }


def test_a_log_written_before_the_lifecycle_still_reads_unchanged():
    lines = V1_LOG.read_text().splitlines()
    groups = list(read_groups(V1_LOG))
    assert [(g.outcome, g.zero_variance, g.trained_on) for g in groups] == V1_GROUPS
    # written again, every line is the same JSON but for what later schemas add: its number and
    # the policy version, 0 for a line written before versions were logged (a step's version runs
    # are written only where a reply's versions differ from its group's: never here)
    again = [g.to_dict() for g in groups]
    assert all(d.pop("schema") == 3 and d.pop("policy_version") == 0 for d in again)
    assert again == [{k: v for k, v in json.loads(line).items() if k != "schema"} for line in lines]


def _lifecycle_of(record: GroupRecord) -> GroupLifecycle:
    """The lifecycle a group of this outcome went through."""
    life = GroupLifecycle()
    if record.outcome in (Outcome.CUT, Outcome.AUDITED):
        life.gate_fired()
        life.audit_decided(record.outcome is Outcome.AUDITED)
    if record.outcome is Outcome.FAILED:
        life.fail(record.meta["failure"])
    else:
        life.trajectories_ended()
    return life


def test_the_lifecycle_decides_what_the_log_says_and_what_the_learner_got():
    played = [g for g in read_groups(V1_LOG) if g.outcome is not Outcome.SKIPPED]  # never a group
    for record in played:
        keep = _keep_all if record.outcome is not Outcome.FILTERED else _drop_zero_variance
        rewards = [0.0 if r is None else r for r in record.rewards]
        verdict = _lifecycle_of(record).settle(rewards, keep)
        assert (verdict.outcome, verdict.zero_variance) == (record.outcome, record.zero_variance)
        assert verdict.trained == record.trained_on, record.group_id
