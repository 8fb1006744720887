"""The audit as a budget: which gate stops run on in shadow to measure the gate's precision.

An audited stop costs what the cut would have saved, so the audit is paid for in step-tokens,
not drawn by a coin: a stop is audited while the run's audit spending (tokens its audited groups
used after their gate step) stays within ``budget`` of all step-tokens spent so far, and only
until the lower confidence bound of the audited precision clears ``target_precision`` (then
the gate is known to be good enough on this task distribution and auditing tapers off). The
first stop of a run is always audited (with a non-zero budget), so a run that cut groups
never reports "0 audited" by chance.

Audits still running count too: with many groups in flight, several stops can be chosen before
the first audited group finishes, and counting only finished audits let a 5% budget overspend
several times over. Each audit in flight reserves its expected cost (the mean cost of finished
audits; before any has finished, the mean step-tokens of a finished group, an upper bound of the
part after the gate step; before any group has finished, no second audit is started) until its
group ends, however it ends, and a new audit is started only if its own expected cost fits
too.

Trajectory stops (selective_rollout.trajectory_stop) audit their labels from this same budget: one
share of the run's step-tokens pays for every audit. Their owner reserves what its audits still
running are expected to cost (``reserved``) and ``charge``s what each one spent after its stop
step once its group has ended; both count against the budget like the group audits' own
spending, and ``room_for`` tells that audit whether its next one fits.

It lives in the gate library (base layer) because it needs nothing but records: the coordinator
runs it online, and the held-out evaluation (analysis/gate_eval/heldout.py) replays logs under the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from selective_rollout.records import GroupRecord, Outcome
from selective_rollout.stats import clopper_pearson


def mean_cost(*totals: tuple[float, int]) -> float:
    """The mean of the first (step-tokens, count) pair that counts anything, in order of preference
    (what finished audits cost, then an upper bound of it); inf when none does: nothing has
    finished, so no audit can be priced yet."""
    for total, count in totals:
        if count:
            return total / count
    return float("inf")


@dataclass
class AuditBudget:
    budget: float  # share of the run's step-tokens audits may take (0: never audit, 1: every stop)
    target_precision: float = 0.9
    confidence: float = 0.95
    spent: int = 0  # step-tokens of every finished group
    audit_spent: int = 0  # step-tokens audited groups used after their gate step
    audited: int = 0
    audited_zero_variance: int = 0
    chosen: int = 0  # stops chosen for audit, finished or not (a run's first stop is one)
    in_flight: int = 0  # chosen audits whose group has not ended yet
    finished: int = 0  # groups observed, of every outcome
    charged: int = 0  # step-tokens other audits (trajectory stops) spent, charged to this budget
    reserved: float = 0.0  # what the other audits still running are expected to cost, set by their owner

    def want_audit(self) -> bool:
        """Called when the gate stops a group: run this one on in shadow?"""
        if self.budget <= 0:
            return False
        if self.chosen == 0:
            return True
        if self.precision_low() >= self.target_precision:
            return False
        if self.budget >= 1.0:
            return True
        # this audit's own expected cost counts too: checking only what is already spent or
        # reserved let each new audit take the share over the budget by one audit's worth (two
        # audits of the stalled gate took 7.3% of a run's step-tokens against a 5% budget)
        return self.room_for(self.expected_cost())

    def room_for(self, cost: float) -> bool:
        """Whether an audit expected to cost ``cost`` step-tokens fits: what audits spent (the group
        audits' and what other audits were charged), what the audits still running reserve and
        ``cost`` stay within ``budget`` of all step-tokens spent. A budget of 1 fits every audit,
        one of 0 none."""
        if self.budget <= 0:
            return False
        if self.budget >= 1.0:
            return True
        groups = self.in_flight * self.expected_cost() if self.in_flight else 0.0
        committed = self.audit_spent + self.charged + groups + self.reserved
        return committed + cost <= self.budget * self.spent

    def charge(self, tokens: int) -> None:
        """Another audit drawing on this budget spent ``tokens`` step-tokens (accounted when its
        group ended, after ``observe`` counted the group's spending)."""
        self.charged += tokens

    def expected_cost(self) -> float:
        """What an audit in flight is expected to cost in step-tokens (see the module doc)."""
        return mean_cost((self.audit_spent, self.audited), (self.spent, self.finished))

    def decided(self, audit: bool) -> None:
        self.chosen += audit
        self.in_flight += audit

    def observe(self, record: GroupRecord, audit_chosen: bool | None = None) -> None:
        """Account a finished group (every outcome: the budget is a share of all spending).

        ``audit_chosen`` says whether the group had been chosen for audit, which releases its
        reservation even when it ended without an audited outcome (a failure); by default it is
        read off the record's outcome."""
        self.finished += 1
        self.spent += record.step_tokens
        if audit_chosen is None:
            audit_chosen = record.outcome is Outcome.AUDITED
        if audit_chosen:
            self.in_flight = max(0, self.in_flight - 1)
        if record.outcome is Outcome.AUDITED and record.gate is not None:
            self.audited += 1
            self.audited_zero_variance += bool(record.zero_variance)
            self.audit_spent += record.tokens_after(record.gate.step)

    def precision_low(self) -> float:
        if not self.audited:
            return 0.0
        return clopper_pearson(self.audited_zero_variance, self.audited, self.confidence)[0]
