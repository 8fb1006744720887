"""Which trajectory stops run on in shadow to measure whether the rule's labels are right.

A stopped trajectory's true reward is unknown by construction, and a wrong label changes its
group's advantages, so some stops run on instead (``audited``): the trajectory keeps playing, its
record carries the stop, and its final reward says whether the assigned one was right. An audit
costs what the stop would have saved, so it is paid from the run's one audit budget
(``gate.audit.AuditBudget``, ``rollout.audit_budget``), next to the gate's audits:

- the run's first trajectory stop is audited whenever the budget is non-zero (a run with stops
  never reports "0 audited");
- later ones while the exact 95% lower bound of the label precision is below the target
  (``trajectory_stop.audit_target``) and the budget has room for this audit's expected cost: the
  mean step-tokens finished audits spent after their stop step, or, before any has finished, the
  mean step-tokens of a finished trajectory (an upper bound of the part after a stop), none
  before any trajectory has finished (unless the budget is 1, which audits every stop);
- audits still running reserve that expected cost in the budget until their group ends, so the
  gate's audits cannot spend it twice; then what each spent after its stop step is charged.
"""

from __future__ import annotations

from dataclasses import dataclass

from selective_rollout.gate.audit import AuditBudget, mean_cost
from selective_rollout.records import GroupRecord, TrajectoryStatus
from selective_rollout.stats import clopper_pearson

_RAN_TO_THE_END = (TrajectoryStatus.FINISHED, TrajectoryStatus.TRUNCATED)


@dataclass
class StopAudits:
    budget: AuditBudget  # the run's one audit budget, shared with the gate's audits
    target: float = 0.95  # the label precision whose lower bound ends the audits
    confidence: float = 0.95
    chosen: int = 0  # stops chosen for audit, finished or not
    in_flight: int = 0  # chosen audits whose group has not ended
    audited: int = 0  # finished audits with a measured label
    right: int = 0  # of those, the ones whose assigned reward was the true one
    audit_spent: int = 0  # step-tokens finished audits spent after their stop step
    finished: int = 0  # trajectories observed that ran to their end
    finished_tokens: int = 0  # their step-tokens

    def want_audit(self) -> bool:
        """Called when the rule stops a trajectory: run this one on in shadow?"""
        if self.budget.budget <= 0:
            return False
        if self.chosen == 0:
            return True
        if self.precision_low() >= self.target:
            return False
        return self.budget.room_for(self.expected_cost())

    def decided(self, audit: bool) -> None:
        self.chosen += audit
        self.in_flight += audit
        self._reserve()

    def expected_cost(self) -> float:
        """What an audit in flight is expected to cost in step-tokens (see the module doc)."""
        return mean_cost((self.audit_spent, self.audited), (self.finished_tokens, self.finished))

    def observe(self, record: GroupRecord) -> None:
        """Account an ended group (any outcome): its audited stops release their reservation and,
        where the label was measured, count for precision and are charged what they spent after
        their stop step; its trajectories that ran to the end teach the cost before any audit has."""
        for t in record.trajectories:
            if t.reward is not None and t.status in _RAN_TO_THE_END:
                self.finished += 1
                self.finished_tokens += sum(t.step_tokens)
            if t.stop is None or not t.stop.audited:
                continue
            self.in_flight = max(0, self.in_flight - 1)
            if t.label_right is not None:
                spent = sum(t.step_tokens[t.stop.step :])
                self.audited += 1
                self.right += t.label_right
                self.audit_spent += spent
                self.budget.charge(spent)
        self._reserve()

    def precision_low(self) -> float:
        if not self.audited:
            return 0.0
        return clopper_pearson(self.right, self.audited, self.confidence)[0]

    def _reserve(self) -> None:
        self.budget.reserved = self.in_flight * self.expected_cost() if self.in_flight else 0.0
