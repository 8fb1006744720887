"""Trajectory stop audits: their own label precision and target, paid from the gate's audit budget."""

from __future__ import annotations

from selective_rollout.gate.audit import AuditBudget
from selective_rollout.records import GroupRecord, Outcome, Step, Trajectory, TrajectoryStatus, TrajectoryStop
from selective_rollout.stats import clopper_pearson
from selective_rollout.trajectory_stop.audit import StopAudits


def _group(stop: TrajectoryStop | None = None, reward: float = 0.0) -> GroupRecord:
    """Two trajectories of 5 steps x 10 step-tokens (100 in all); the second carries ``stop``."""
    steps = [Step("look", True, 10, 0)] * 5
    trajectories = [
        Trajectory(0, list(steps), reward=1.0, won=True),
        Trajectory(1, list(steps), reward=reward, status=TrajectoryStatus.TRUNCATED, stop=stop),
    ]
    return GroupRecord("g", "t", "x", trajectories, Outcome.COMPLETED)


def _observe(budget: AuditBudget, stops: StopAudits, record: GroupRecord) -> None:
    """What the scheduler does with every ended group."""
    budget.observe(record)
    stops.observe(record)


def _shared(groups: int = 40) -> tuple[AuditBudget, StopAudits]:
    budget = AuditBudget(budget=0.05)
    stops = StopAudits(budget)
    for _ in range(groups):
        _observe(budget, stops, _group())
    return budget, stops


def test_a_trajectory_audit_in_flight_reserves_its_cost_in_the_gate_s_budget() -> None:
    # 4,000 step-tokens spent: the 5% budget is 200. One group audit in flight reserves 100 (the
    # mean group); a second would just fit (100 + 100 <= 200) until a trajectory audit reserves 50
    # (the mean trajectory) of the same budget
    budget, stops = _shared()
    budget.decided(budget.want_audit())
    assert budget.want_audit()
    assert stops.want_audit()  # the run's first trajectory stop
    stops.decided(True)
    assert budget.reserved == 50 and not budget.want_audit()


def test_a_charged_trajectory_audit_blocks_a_group_audit_that_no_longer_fits() -> None:
    budget, stops = _shared()
    budget.decided(budget.want_audit())
    stops.decided(stops.want_audit())
    # its group ends: the audited trajectory spent 30 step-tokens after its stop step, and its label
    # was right; its reservation is released and the 30 are charged to the budget
    _observe(budget, stops, _group(TrajectoryStop(2, 0.0, "outlived", audited=True)))
    assert budget.reserved == 0 and budget.charged == 30 and budget.spent == 4100
    assert (stops.audited, stops.right, stops.expected_cost()) == (1, 1, 30)
    # 30 charged + 100 reserved + 100 for the new one = 230 > 5% of 4,100; without the charge it fits
    assert not budget.want_audit()
    budget.charged = 0
    assert budget.want_audit()


def test_the_first_trajectory_stop_is_audited_then_only_what_the_budget_can_price() -> None:
    budget = AuditBudget(budget=0.05)
    stops = StopAudits(budget)
    assert stops.want_audit()
    stops.decided(True)
    assert stops.expected_cost() == float("inf") and not stops.want_audit()  # nothing finished yet
    assert not StopAudits(AuditBudget(budget=0.0)).want_audit()
    everything = StopAudits(AuditBudget(budget=1.0))
    for _ in range(3):
        assert everything.want_audit()
        everything.decided(True)


def test_auditing_ends_once_the_label_precision_clears_its_own_target() -> None:
    budget = AuditBudget(budget=1.0, target_precision=0.5)  # the gate's target does not count here
    stops = StopAudits(budget, target=0.95)
    n = 0
    while stops.want_audit():
        stops.decided(True)
        _observe(budget, stops, _group(TrajectoryStop(2, 0.0, "outlived", audited=True)))
        n += 1
        assert n < 200
    assert clopper_pearson(n, n)[0] >= 0.95 > clopper_pearson(n - 1, n - 1)[0]
    assert budget.audited == 0  # no group audit was counted


def test_a_wrong_label_is_counted_and_keeps_the_audits_going() -> None:
    budget = AuditBudget(budget=1.0)
    stops = StopAudits(budget, target=0.9)
    stops.decided(True)
    _observe(budget, stops, _group(TrajectoryStop(2, 0.0, "outlived", audited=True), reward=1.0))
    assert (stops.audited, stops.right) == (1, 0) and stops.want_audit()


def test_an_audit_whose_group_was_cut_releases_its_reservation_without_a_label() -> None:
    budget, stops = _shared()
    stops.decided(stops.want_audit())
    assert budget.reserved == 50
    cut = _group(TrajectoryStop(2, 0.0, "outlived", audited=True))
    cut.trajectories[1].reward, cut.trajectories[1].status = None, TrajectoryStatus.CUT
    _observe(budget, stops, cut)
    assert budget.reserved == 0 and stops.audited == 0 and budget.charged == 0 and stops.in_flight == 0
