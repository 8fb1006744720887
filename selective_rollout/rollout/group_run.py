"""One group in flight: G trajectories of one task, their divergence state and the gate's verdict.

The group is where the gate meets the trajectories. After every step of any trajectory it hands
the action to its ``GateWatch`` (gate/watch.py), which keeps the incremental tracker and asks
the gate when its schedule says so (in ``at_k`` mode: once every live trajectory has K actions,
ended ones END-padded), exactly as the integrations' ``LiveGroup`` does. What follows is the
group's lifecycle (selective_rollout/lifecycle.py): a stop cuts the group, an audited stop lets it run on in
shadow, and the state it ends in settles its record and whether the learner gets it.

Before the watch hears of a step, the run's trajectory stop rule (selective_rollout.trajectory_stop)
is asked about the trajectory that took it, while the gate has not fired on the group: a rule that
judges the trajectory decided either ends it now with the assigned reward (status STOPPED; the
watch then hears that it ended) or, when its audit budget picks it, lets it run on in shadow with
the stop on its record. A group the gate stopped is left alone: a cut one is over, and an audited
one must run whole to say whether the gate was right.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from selective_rollout.gate import Gate, GateWatch
from selective_rollout.gate.audit import AuditBudget
from selective_rollout.lifecycle import GroupLifecycle, Verdict
from selective_rollout.records import (
    Experience,
    GateRecord,
    GroupRecord,
    Outcome,
    Step,
    Trajectory,
    TrajectoryStatus,
    TrajectoryStop,
)
from selective_rollout.trajectory_stop import NoStop, TrajectoryRule, TrajectoryView
from selective_rollout.trajectory_stop.audit import StopAudits

if TYPE_CHECKING:
    from selective_rollout.rollout.dialogue import Conversation


@dataclass
class TrajectoryRun:
    """Mutable state of one trajectory while it runs."""

    index: int
    episode_id: str
    session_id: str
    conversation: Conversation  # the dialogue: prompts, replies, the learner's segments
    steps: list[Step] = field(default_factory=list)
    status: TrajectoryStatus | None = None  # None while live
    won: bool = False
    reward: float = 0.0  # the environment's reward rule on the last state once it ended; or assigned
    request_id: str | None = None  # the engine request in flight, if any
    admissible: list[str] = field(default_factory=list)
    stop: TrajectoryStop | None = None  # the trajectory stop rule's verdict, once it fired

    @property
    def live(self) -> bool:
        return self.status is None

    @property
    def actions(self) -> list[str]:
        return [s.action for s in self.steps]

    def record(self, status: TrajectoryStatus | None = None) -> Trajectory:
        status = status or self.status or TrajectoryStatus.CUT
        reward = None if status in (TrajectoryStatus.CUT, TrajectoryStatus.FAILED) else self.reward
        return Trajectory(
            self.index, list(self.steps), reward=reward, won=self.won, status=status, stop=self.stop
        )


class GroupRun:
    """G trajectories of one task plus the gate bookkeeping for them."""

    def __init__(
        self,
        group_id: str,
        task_id: str,
        task_type: str,
        g: int,
        gate: Gate,
        audits: AuditBudget | None = None,
        rule: TrajectoryRule | None = None,
        stop_audits: StopAudits | None = None,
    ) -> None:
        self.group_id, self.task_id, self.task_type = group_id, task_id, task_type
        self._audits = audits  # asked, when the gate fires, whether to run on in shadow
        self._rule = rule or NoStop()  # the run's trajectory stop rule
        self._stop_audits = stop_audits  # asked, when the rule fires, whether to run on in shadow
        self.watch = GateWatch(gate, g, describe=True, task_id=task_id, task_type=task_type)
        self.trajectories: list[TrajectoryRun] = []
        self.life = GroupLifecycle()
        self.engine_index = 0
        self.sample_key = group_id  # what seeds its trajectories' sampling (the coordinator's key)
        self.policy_version = 0  # learner updates the weights that play it have seen
        self.started = time.perf_counter()
        self._gate_moved: asyncio.Event | None = None  # set at the next step of any trajectory

    async def hold_for_gate(self, traj: TrajectoryRun) -> None:
        """Wait while the gate's decision at the step ``traj`` has reached is still to come (the
        concurrent coordinator with ``rollout.hold_at_gate``): every step of the group's other
        trajectories may bring it, so each one wakes the waiters to look again."""
        while self.watch.holds(traj.index) and not self.life.stopped:
            if self._gate_moved is None:
                self._gate_moved = asyncio.Event()
            await self._gate_moved.wait()

    @property
    def decision(self) -> GateRecord | None:
        """The gate's latest decision on the group (the stopping one once it fired)."""
        return self.watch.decision

    def after_step(self, traj: TrajectoryRun) -> None:
        """Ask the trajectory stop rule about the trajectory's newest step, then hand the action to
        the gate's watch; a gate stop cuts the group unless the audit budget runs it on in shadow."""
        self._ask_rule(traj)
        fired = self.watch.act(traj.index, traj.steps[-1].action, ended=not traj.live)
        if self._gate_moved is not None:
            self._gate_moved.set()
            self._gate_moved = None
        if fired is not None:
            self.life.gate_fired()
            audit = self._audits is not None and self._audits.want_audit()
            if self._audits is not None:
                self._audits.decided(audit)
            self.life.audit_decided(audit)
        elif not any(t.live for t in self.trajectories):
            self.life.trajectories_ended()

    def _ask_rule(self, traj: TrajectoryRun) -> None:
        """Called once per step of each trajectory, so a trajectory is asked at most once per step;
        one that ended, or whose stop is being audited, is not asked again."""
        step = len(traj.steps)
        if not traj.live or traj.stop is not None or self.watch.fired or not self._rule.due(step):
            return
        reward = self._rule.decide(self._view(traj.index, step))
        if reward is None:
            return
        audit = self._stop_audits is not None and self._stop_audits.want_audit()
        if self._stop_audits is not None:
            self._stop_audits.decided(audit)
        traj.stop = TrajectoryStop(step, reward, self._rule.name, audited=audit)
        if not audit:
            traj.status, traj.reward = TrajectoryStatus.STOPPED, reward

    def _view(self, index: int, step: int) -> TrajectoryView:
        """The group as it stands now, for the rule's question about trajectory ``index``."""
        trajectories = self.trajectories
        return TrajectoryView(
            index=index,
            step=step,
            actions=[t.actions for t in trajectories],
            won=[t.won for t in trajectories],
            ended=[not t.live for t in trajectories],
            g=len(trajectories),
        )

    def settle(self, keep: Callable[[bool], bool]) -> Verdict:
        """The group's verdict (``GroupLifecycle.settle``); ``keep`` is the strategy's."""
        return self.life.settle([t.reward for t in self.trajectories], keep)

    def to_record(self, iteration: int, verdict: Verdict) -> GroupRecord:
        status = TrajectoryStatus.FAILED if verdict.outcome is Outcome.FAILED else None
        meta: dict[str, object] = {"engine": self.engine_index}
        if self.life.failure is not None:
            meta["failure"] = self.life.failure
        return GroupRecord(
            group_id=self.group_id,
            task_id=self.task_id,
            task_type=self.task_type,
            trajectories=[t.record(status) for t in self.trajectories],
            outcome=verdict.outcome,
            iteration=iteration,
            gate=self.decision,
            wall_s=time.perf_counter() - self.started,
            meta=meta,
            policy_version=self.policy_version,
        )

    def experiences(self) -> list[Experience]:
        """One Experience per dialogue segment of every trajectory, rewarded with the final reward."""
        return [
            replace(e, policy_version=self.policy_version)
            for t in self.trajectories
            for e in t.conversation.experiences(
                self.group_id, self.task_id, self.task_type, t.reward, t.index
            )
        ]
