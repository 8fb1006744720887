"""The life of one group, and the one place where its fate is settled.

A group starts RUNNING. When the gate fires it is AT_GATE, and the audit budget sends it on:
CUT (stopped now) or AUDITED (run on in shadow to measure the gate's precision). A group the gate
never stops is FINISHED once every trajectory has ended. A dead engine or env worker makes it
FAILED: while it runs, audited or not, or while a cut group's trajectories are being cancelled.

``GroupLifecycle.settle`` turns the state a group ended in into its record's outcome and says
whether the learner gets it. The strategy's ``keep`` is asked there and only for a FINISHED group,
the one case where the strategy has a say (it drops it: FILTERED); the record's other outcome,
SKIPPED, is a task that never became a group. Whether an outcome reaches the learner is
``Outcome.trains``, the rule ``GroupRecord.trained_on`` applies to a logged group too, so the
batch and the log never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from selective_rollout.records import Outcome, rewards_equal


class GroupState(str, Enum):
    RUNNING = "running"
    AT_GATE = "at_gate"  # the gate fired; the audit budget decides between CUT and AUDITED
    CUT = "cut"  # stopped by the gate: its work is cancelled
    AUDITED = "audited"  # stopped by the gate, yet run on to the end to check the stop
    FINISHED = "finished"  # every trajectory ended without a stop
    FAILED = "failed"  # an engine or env worker died under it


_MOVES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.RUNNING: frozenset({GroupState.AT_GATE, GroupState.FINISHED, GroupState.FAILED}),
    GroupState.AT_GATE: frozenset({GroupState.CUT, GroupState.AUDITED}),
    # a stopped group's other trajectories may still fail before they are cancelled
    GroupState.CUT: frozenset({GroupState.FAILED}),
    GroupState.AUDITED: frozenset({GroupState.FAILED}),
    GroupState.FINISHED: frozenset(),
    GroupState.FAILED: frozenset(),
}

# the outcome of the states whose rewards are unknown (a finished or audited group's are read)
_OUTCOME = {GroupState.CUT: Outcome.CUT, GroupState.FAILED: Outcome.FAILED}


@dataclass(frozen=True)
class Verdict:
    """A settled group: what its record says and whether the learner gets it."""

    outcome: Outcome
    zero_variance: bool | None  # None when its final rewards are unknown (cut, failed)

    @property
    def trained(self) -> bool:
        return self.outcome.trains(self.zero_variance)


class GroupLifecycle:
    """One group's state, the states it went through and, once failed, why."""

    def __init__(self) -> None:
        self.trail: list[GroupState] = [GroupState.RUNNING]
        self.failure: str | None = None

    @property
    def state(self) -> GroupState:
        return self.trail[-1]

    @property
    def stopped(self) -> bool:
        """The gate cut the group: every trajectory stops now."""
        return self.state is GroupState.CUT

    @property
    def audit_chosen(self) -> bool:
        """The audit budget chose the group, even if it failed since (its reservation is released)."""
        return GroupState.AUDITED in self.trail

    def _move(self, to: GroupState) -> None:
        if to not in _MOVES[self.state]:
            raise RuntimeError(f"a group cannot go from {self.state.value} to {to.value}")
        self.trail.append(to)

    def gate_fired(self) -> None:
        """The gate says stop; the audit budget is asked next (``audit_decided``)."""
        self._move(GroupState.AT_GATE)

    def audit_decided(self, audit: bool) -> None:
        """``audit``: the stopped group runs on in shadow; else it is cut now."""
        self._move(GroupState.AUDITED if audit else GroupState.CUT)

    def trajectories_ended(self) -> None:
        """Every trajectory has ended: a running group is finished (an audited one stays audited)."""
        if self.state is GroupState.RUNNING:
            self._move(GroupState.FINISHED)

    def fail(self, why: str) -> None:
        self._move(GroupState.FAILED)
        self.failure = why

    def settle(self, rewards: Sequence[float], keep: Callable[[bool], bool]) -> Verdict:
        """The group's verdict from the state it ended in. ``rewards``: its trajectories' final
        rewards, read only where they are whole (finished or audited); ``keep``: the strategy's
        answer, asked only for a finished group, given whether it is zero-variance."""
        if self.state in (GroupState.RUNNING, GroupState.AT_GATE):
            raise RuntimeError(f"a group still {self.state.value} has no verdict yet")
        if self.state is GroupState.FINISHED:
            zero = rewards_equal(rewards)
            return Verdict(Outcome.COMPLETED if keep(zero) else Outcome.FILTERED, zero)
        if self.state is GroupState.AUDITED:
            return Verdict(Outcome.AUDITED, rewards_equal(rewards))
        return Verdict(_OUTCOME[self.state], None)
