"""The audit budget: first stop always audited, spending capped, tapering once precision is known."""

from __future__ import annotations

import pytest

from selective_rollout.gate.audit import AuditBudget
from selective_rollout.records import GateRecord, GroupRecord, Outcome, Step, Trajectory
from selective_rollout.stats import clopper_pearson


def _group(
    outcome: Outcome, tokens_per_step: int, steps: int, rewards: list[float], gate_step: int | None = 2
):
    trajectories = [
        Trajectory(i, [Step("look", True, tokens_per_step, 0) for _ in range(steps)], reward=r, won=bool(r))
        for i, r in enumerate(rewards)
    ]
    gate = GateRecord(step=gate_step, stop=True, reason="", features={}) if gate_step else None
    return GroupRecord("g", "t", "x", trajectories, outcome, gate=gate)


def test_first_stop_is_audited_even_with_a_tiny_budget() -> None:
    audits = AuditBudget(budget=0.001)
    assert audits.want_audit()
    audits.decided(True)
    # a second stop before any spending is on record: the budget (0.1% of 0 tokens) says no
    assert not audits.want_audit()


def test_a_full_budget_audits_every_stop_even_before_any_spending() -> None:
    audits = AuditBudget(budget=1.0)
    for _ in range(3):  # concurrent stops, none finished yet
        assert audits.want_audit()
        audits.decided(True)


def test_zero_budget_never_audits() -> None:
    assert not AuditBudget(budget=0.0).want_audit()


def test_spending_is_capped_at_the_budget_share() -> None:
    audits = AuditBudget(budget=0.05)
    audits.decided(audits.want_audit())
    # the audited group spent 2 trajectories x 8 steps x 10 tokens after its gate step (step 2)
    audits.observe(_group(Outcome.AUDITED, 10, 10, [0.0, 0.0]))
    assert audits.audit_spent == 2 * 8 * 10 and audits.spent == 200
    assert not audits.want_audit()  # 160 of 200 tokens went to audit: far over 5%
    for _ in range(16):  # 3,200 more tokens of ordinary groups: 160 < 5% of 3,400 = 170 ...
        audits.observe(_group(Outcome.COMPLETED, 10, 10, [0.0, 1.0], gate_step=None))
    assert not audits.want_audit()  # ... but a second audit, expected to cost 160 too, would not fit
    for _ in range(15):  # 6,400 in all: 160 spent + 160 expected = 5% of it
        audits.observe(_group(Outcome.COMPLETED, 10, 10, [0.0, 1.0], gate_step=None))
    assert audits.want_audit()


def _spend(audits: AuditBudget, groups: int) -> None:
    """``groups`` finished ordinary groups of 100 step-tokens each (2 x 5 steps x 10 tokens)."""
    for _ in range(groups):
        audits.observe(_group(Outcome.COMPLETED, 10, 5, [0.0, 1.0], gate_step=None))


def test_audits_in_flight_reserve_their_expected_cost() -> None:
    # 4,000 tokens spent, so a 5% budget is 200 tokens; a group costs 100 on average.
    # Ten stops arrive while their groups are all still running: counting finished audits only,
    # all ten would be audited (0 spent < 200); reserving 100 each, the new one's own included, two are.
    audits = AuditBudget(budget=0.05)
    _spend(audits, 40)
    chosen = 0
    for _ in range(10):
        audit = audits.want_audit()
        audits.decided(audit)
        chosen += audit
    assert chosen == 2 and audits.in_flight == 2
    # one audited group ends having cost 40 tokens after its gate step: the expected cost is now
    # its real mean (40), so 40 spent + 1 x 40 reserved < 200 leaves room for more audits
    audits.observe(_group(Outcome.AUDITED, 10, 4, [0.0, 0.0], gate_step=2), audit_chosen=True)
    assert audits.in_flight == 1 and audits.expected_cost() == 40
    assert audits.want_audit()


def test_an_audit_that_fails_releases_its_reservation() -> None:
    audits = AuditBudget(budget=0.05)
    _spend(audits, 40)
    for _ in range(2):
        audits.decided(audits.want_audit())
    assert not audits.want_audit()
    failed = _group(Outcome.FAILED, 10, 3, [0.0, 0.0], gate_step=2)
    audits.observe(failed, audit_chosen=True)  # its engine died: no audited outcome, no precision
    assert audits.in_flight == 1 and audits.audited == 0
    assert audits.want_audit()


def test_no_second_audit_before_any_group_has_finished() -> None:
    audits = AuditBudget(budget=0.5)
    audits.decided(audits.want_audit())
    assert audits.expected_cost() == float("inf") and not audits.want_audit()


def test_auditing_tapers_once_the_precision_bound_clears_the_target() -> None:
    audits = AuditBudget(budget=1.0, target_precision=0.9)
    n = 0
    while audits.want_audit():
        audits.decided(True)
        audits.observe(_group(Outcome.AUDITED, 1, 3, [1.0, 1.0]))
        n += 1
        assert n < 100
    # all audits were zero-variance: stops once the exact 95% lower bound reaches 0.9
    assert clopper_pearson(n, n)[0] >= 0.9 > clopper_pearson(n - 1, n - 1)[0]


def test_a_false_cut_keeps_the_audit_going() -> None:
    audits = AuditBudget(budget=1.0, target_precision=0.9)
    audits.decided(True)
    audits.observe(_group(Outcome.AUDITED, 1, 3, [0.0, 1.0]))  # informative: the gate was wrong
    for _ in range(40):
        audits.observe(_group(Outcome.AUDITED, 1, 3, [1.0, 1.0]))
    assert audits.precision_low() < 0.9 or audits.want_audit()


@pytest.mark.parametrize(("hits", "n"), [(0, 5), (3, 4), (10, 10)])
def test_clopper_pearson_contains_the_estimate(hits: int, n: int) -> None:
    low, high = clopper_pearson(hits, n)
    assert 0.0 <= low <= hits / n <= high <= 1.0
    assert clopper_pearson(10, 10)[0] == pytest.approx(0.025 ** (1 / 10))


def test_clopper_pearson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_other_audits_spending_and_reservations_count_against_the_budget() -> None:
    audits = AuditBudget(budget=0.05)
    _spend(audits, 40)  # 4,000 tokens: 200 may go to audits; a group costs 100
    audits.decided(audits.want_audit())  # the run's first stop, still running: 100 reserved
    assert audits.want_audit()  # a second one just fits: 100 + 100 <= 200
    assert audits.room_for(100) and not audits.room_for(101)
    audits.reserved = 1.0  # another audit still running (a trajectory stop's) reserves its cost
    assert not audits.want_audit()
    audits.reserved = 0.0
    audits.charge(1)  # what it spent, once its group ended
    assert not audits.want_audit()
    assert AuditBudget(budget=1.0).room_for(1e12) and not AuditBudget(budget=0.0).room_for(0)
