"""One group in flight: G trajectories of one task, their divergence state and the gate's verdict.

The group is where the gate meets the trajectories. After every step of any trajectory it
updates the incremental tracker and, when the gate's schedule says so (in ``at_k`` mode: once
every live trajectory has K actions, ended ones END-padded), asks the gate. A stop cancels the
group; an audited stop only records the verdict and lets the group run on in shadow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from selective_rollout.gate import DivergenceTracker, Gate, GroupState, features_at
from selective_rollout.records import (
    Experience,
    GateRecord,
    GroupRecord,
    Outcome,
    Step,
    Trajectory,
    TrajectoryStatus,
    rewards_equal,
)
from selective_rollout.rollout.audit import AuditBudget


@dataclass
class Segment:
    """A stretch of one trajectory's dialogue that the learner packs as one sequence."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add_prompt(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def add_completion(self, ids: list[int], logprobs: list[float]) -> None:
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs


@dataclass
class TrajectoryRun:
    """Mutable state of one trajectory while it runs."""

    index: int
    episode_id: str
    session_id: str
    segments: list[Segment] = field(default_factory=lambda: [Segment()])
    steps: list[Step] = field(default_factory=list)
    status: TrajectoryStatus | None = None  # None while live
    won: bool = False
    reward: float = 0.0  # the environment's reward rule on the last state, once it ended
    request_id: str | None = None  # the engine request in flight, if any
    conversation: Any = None  # the agent's token-level dialogue state
    admissible: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.status is None

    @property
    def actions(self) -> list[str]:
        return [s.action for s in self.steps]

    @property
    def segment(self) -> Segment:
        return self.segments[-1]

    def record(self, status: TrajectoryStatus | None = None) -> Trajectory:
        status = status or self.status or TrajectoryStatus.CUT
        reward = None if status in (TrajectoryStatus.CUT, TrajectoryStatus.FAILED) else self.reward
        return Trajectory(self.index, list(self.steps), reward=reward, won=self.won, status=status)


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
    ) -> None:
        self.group_id, self.task_id, self.task_type = group_id, task_id, task_type
        self.gate = gate
        self._audits = audits  # asked, when the gate fires, whether to run on in shadow
        self.audit = False
        # a single-episode group (held-out evaluation with one try) has no pairs to track
        self.tracker = DivergenceTracker(g) if g >= 2 else None
        self.trajectories: list[TrajectoryRun] = []
        self.decision: GateRecord | None = None
        self.stopped = False  # the gate fired and the group is not audited: cancel it
        self.failure: str | None = None
        self.engine_index = 0
        self.sample_key = group_id  # what seeds its trajectories' sampling (the coordinator's key)
        self._checked_through = 0
        self.started = time.perf_counter()

    def after_step(self, traj: TrajectoryRun) -> None:
        """Feed the trajectory's newest action to the tracker, then consult the gate if due."""
        if self.tracker is None:
            return
        self.tracker.append(traj.index, traj.steps[-1].action)
        if not traj.live:
            self.tracker.end(traj.index)
        self._consult_gate()

    def _consult_gate(self) -> None:
        if self.decision is not None and self.decision.stop:
            return
        live = [t for t in self.trajectories if t.live]
        if not live:
            return  # the group is over; nothing left to save
        reachable = min(len(t.steps) for t in live)
        for step in range(self._checked_through + 1, reachable + 1):
            self._checked_through = step
            if not self.gate.should_check(step):
                continue
            ended = [not t.live for t in self.trajectories]
            state = GroupState(
                [t.actions for t in self.trajectories], step=step, ended=ended, tracker=self.tracker
            )
            verdict = self.gate.decide(state)
            features = {**features_at(state), **verdict.features}
            self.decision = GateRecord(step=step, stop=verdict.stop, reason=verdict.reason, features=features)
            if verdict.stop:
                if self._audits is not None:
                    self.audit = self._audits.want_audit()
                    self._audits.decided(self.audit)
                self.stopped = not self.audit
                return

    @property
    def fired(self) -> bool:
        return self.decision is not None and self.decision.stop

    def outcome(self, keep: bool) -> Outcome:
        if self.failure is not None:
            return Outcome.FAILED
        if self.fired:
            return Outcome.AUDITED if self.audit else Outcome.CUT
        return Outcome.COMPLETED if keep else Outcome.FILTERED

    def zero_variance(self) -> bool | None:
        """Whether the finished group's rewards (the environment's rule, as its record says) are all
        equal; None when they are unknown (failed, or cut without audit)."""
        if self.failure is not None or self.stopped:
            return None
        return rewards_equal([t.reward for t in self.trajectories])

    def to_record(self, iteration: int, outcome: Outcome, meta: dict) -> GroupRecord:
        status = TrajectoryStatus.FAILED if outcome is Outcome.FAILED else None
        return GroupRecord(
            group_id=self.group_id,
            task_id=self.task_id,
            task_type=self.task_type,
            trajectories=[t.record(status) for t in self.trajectories],
            outcome=outcome,
            iteration=iteration,
            gate=self.decision,
            wall_s=time.perf_counter() - self.started,
            meta=meta,
        )

    def experiences(self) -> list[Experience]:
        """One Experience per dialogue segment of every trajectory, rewarded with the final reward."""
        out = []
        for t in self.trajectories:
            for seg in t.segments:
                if any(seg.loss_mask):
                    out.append(
                        Experience(
                            group_id=self.group_id,
                            task_id=self.task_id,
                            task_type=self.task_type,
                            token_ids=list(seg.token_ids),
                            loss_mask=list(seg.loss_mask),
                            old_logprobs=list(seg.logprobs),
                            reward=t.reward,
                            trajectory=t.index,
                        )
                    )
        return out
