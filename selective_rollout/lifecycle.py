"""The life of one group, and the one place where its fate is settled.

Runs (``rollout.group_run``), the offline replay of a gate on logged groups
(``analysis.gate_eval.replay``) and ``integrations.live_group`` (the gate inside other trainers' loops)
all drive this one machine, so a group's outcome means the same wherever it was decided.

A group starts RUNNING. When the gate fires it is AT_GATE, and the audit budget sends it on:
CUT (stopped now) or AUDITED (run on in shadow to measure the gate's precision). A group the gate
never stops is FINISHED once every trajectory has ended. A dead engine or env worker makes it
FAILED: while it runs, audited or not, or while a cut group's trajectories are being cancelled.

``GroupLifecycle.settle`` turns the state a group ended in into its record's outcome and says
whether the learner gets it. The strategy's ``keep`` is asked there and only for a FINISHED group,
the one case where the strategy has a say (it drops it: FILTERED). The record's other outcomes:
SKIPPED, a task that never became a group, and STALE, a trainable group the stream pipeline drops
because its weights lag the learner's beyond the bound (``Verdict.too_stale``). Whether an outcome
reaches the learner is ``Outcome.trains``, the rule ``GroupRecord.trained_on`` applies to a
logged group too, so the batch and the log never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from selective_rollout.records import Outcome, rewards_equal


class GroupPhase(str, Enum):
    RUNNING = "running"
    AT_GATE = "at_gate"  # the gate fired; the audit budget decides between CUT and AUDITED
    CUT = "cut"  # stopped by the gate: its work is cancelled
    AUDITED = "audited"  # stopped by the gate, yet run on to the end to check the stop
    FINISHED = "finished"  # every trajectory ended without a stop
    FAILED = "failed"  # an engine or env worker died under it


_MOVES: dict[GroupPhase, frozenset[GroupPhase]] = {
    GroupPhase.RUNNING: frozenset({GroupPhase.AT_GATE, GroupPhase.FINISHED, GroupPhase.FAILED}),
    GroupPhase.AT_GATE: frozenset({GroupPhase.CUT, GroupPhase.AUDITED}),
    # a stopped group's other trajectories may still fail before they are cancelled
    GroupPhase.CUT: frozenset({GroupPhase.FAILED}),
    GroupPhase.AUDITED: frozenset({GroupPhase.FAILED}),
    GroupPhase.FINISHED: frozenset(),
    GroupPhase.FAILED: frozenset(),
}

# the outcome of the states whose rewards are unknown (a finished or audited group's are read)
_OUTCOME = {GroupPhase.CUT: Outcome.CUT, GroupPhase.FAILED: Outcome.FAILED}


@dataclass(frozen=True)
class Verdict:
    """A settled group: what its record says and whether the learner gets it."""

    outcome: Outcome
    zero_variance: bool | None  # None when its final rewards are unknown (cut, failed)

    @property
    def trained(self) -> bool:
        return self.outcome.trains(self.zero_variance)

    def too_stale(self) -> Verdict:
        """A trainable group whose weights lag too far behind the learner's by the time its batch
        trains (``driver.pipeline=stream``): STALE, never trained, its rewards kept."""
        if not self.trained:
            raise RuntimeError(
                f"a {self.outcome.value} group is not trained, so it cannot be dropped as stale"
            )
        return Verdict(Outcome.STALE, self.zero_variance)


class GroupLifecycle:
    """One group's state, the states it went through and, once failed, why."""

    def __init__(self) -> None:
        self.trail: list[GroupPhase] = [GroupPhase.RUNNING]
        self.failure: str | None = None

    @property
    def phase(self) -> GroupPhase:
        return self.trail[-1]

    @property
    def stopped(self) -> bool:
        """The gate cut the group: every trajectory stops now."""
        return self.phase is GroupPhase.CUT

    @property
    def audit_chosen(self) -> bool:
        """The audit budget chose the group, even if it failed since (its reservation is released)."""
        return GroupPhase.AUDITED in self.trail

    def _move(self, to: GroupPhase) -> None:
        if to not in _MOVES[self.phase]:
            raise RuntimeError(f"a group cannot go from {self.phase.value} to {to.value}")
        self.trail.append(to)

    def gate_fired(self) -> None:
        """The gate says stop; the audit budget is asked next (``audit_decided``)."""
        self._move(GroupPhase.AT_GATE)

    def audit_decided(self, audit: bool) -> None:
        """``audit``: the stopped group runs on in shadow; else it is cut now."""
        self._move(GroupPhase.AUDITED if audit else GroupPhase.CUT)

    def trajectories_ended(self) -> None:
        """Every trajectory has ended: a running group is finished (an audited one stays audited)."""
        if self.phase is GroupPhase.RUNNING:
            self._move(GroupPhase.FINISHED)

    def fail(self, why: str) -> None:
        self._move(GroupPhase.FAILED)
        self.failure = why

    def settle(self, rewards: Sequence[float], keep: Callable[[bool], bool]) -> Verdict:
        """The group's verdict from the state it ended in. ``rewards``: its trajectories' final
        rewards, read only where they are whole (finished or audited); ``keep``: the strategy's
        answer, asked only for a finished group, given whether it is zero-variance."""
        if self.phase in (GroupPhase.RUNNING, GroupPhase.AT_GATE):
            raise RuntimeError(f"a group still {self.phase.value} has no verdict yet")
        if self.phase is GroupPhase.FINISHED:
            zero = rewards_equal(rewards)
            return Verdict(Outcome.COMPLETED if keep(zero) else Outcome.FILTERED, zero)
        if self.phase is GroupPhase.AUDITED:
            return Verdict(Outcome.AUDITED, rewards_equal(rewards))
        return Verdict(_OUTCOME[self.phase], None)
