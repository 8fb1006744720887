"""The ``stalled`` gate: stop a group of which no trajectory has finished by step K.

The paper's gate reads convergence: G rollouts that took the same first K actions will end alike.
On tasks whose failures wander (a policy that does not know where the object is tries one
receptacle after another, each rollout another one), the all-fail groups, the longest and
costliest zero-variance groups, are the most diverse at K, and a divergence gate never cuts them.
What does mark them is time: an episode that succeeds ends, and when a partly competent policy
solves a task at all, some of its G tries usually do so early. A group none of whose G
trajectories has finished by step K, late in the episode, is very likely to finish with none
succeeding (all-fail, no GRPO signal); the steps after K are the most expensive ones (the
dialogue is longest), so cutting there still saves a large share of what the group would spend.

"Finished" is the environment's done before the step cap (a trajectory the cap truncates ends
after every decision step). In ALFWorld an episode is done only when it is won, so the rule
reads "no success yet". Where an episode can also end in failure, a finished failure only makes
the gate more cautious (that group is not stopped), never less.

``max_finished_frac`` (the swept threshold) lets a group stop with a few finished trajectories
too (stop when at most that share of the G has finished by K); the default 0 stops only groups
with none, and a negative value none at all (what the held-out calibration picks when no value
reaches its target precision on the fit part). K is the gate's ``k``; docs/gate.md has its
held-out figures on the medium ALFWorld games.

With ``online=[first, last]`` the step is the run's own: K is the prior, and after every labelled
group (uncut, or an audited stop) the step in force becomes the earliest in first..last at which
the rule is precise enough on those groups (``gate/online_step.py``). The held-out step moves with
the task set; this one follows the tasks the run plays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, model_validator

from selective_rollout.gate.base import Calibration, Gate, GateDecision, GateParams, GroupView
from selective_rollout.gate.calibration import best_params
from selective_rollout.gate.features import termination_frac
from selective_rollout.gate.online_step import OnlineStep
from selective_rollout.gate.snapshot import state_at
from selective_rollout.records import GroupRecord


class StalledParams(GateParams):
    max_finished_frac: float = Field(
        0.0,
        ge=-1.0,
        le=1.0,
        description="stop when at most this share of the G trajectories has finished by step K "
        "(0: only groups none of which has; < 0: never stop)",
    )
    online: list[int] = Field(
        default_factory=list,
        description="[first, last]: choose the step online among first..last from the run's labelled "
        "(uncut and audited) groups, k as the prior; []: k fixed",
    )
    target: float = Field(0.9, ge=0.0, le=1.0, description="online: the precision the step must keep")
    confidence: float = Field(
        0.8, gt=0.0, lt=1.0, description="online: two-sided Clopper-Pearson level of the precision bounds"
    )

    @model_validator(mode="after")
    def _online_range(self) -> StalledParams:
        if not self.online:
            return self
        if len(self.online) != 2 or not self.online[0] <= self.k <= self.online[1]:
            raise ValueError(f"online must be [first, last] with first <= k={self.k} <= last: {self.online}")
        if self.mode != "at_k" or self.steps:
            raise ValueError("online chooses one step: it needs mode=at_k and no steps")
        return self


class StalledGate(Gate):
    """Stop when no more than ``max_finished_frac`` of the G trajectories has finished by step K."""

    Params = StalledParams
    threshold = "max_finished_frac"
    params: StalledParams

    def __init__(self, params: GateParams | None = None, **values: Any) -> None:
        super().__init__(params, **values)
        first, last = self.params.online or (self.k, self.k)
        self.online = (
            OnlineStep(
                self.k,
                range(first, last + 1),
                self.params.target,
                self.params.confidence,
                lambda record, step: self.decide(state_at(record, step)).stop,
            )
            if self.params.online
            else None
        )

    @property
    def decision_steps(self) -> list[int]:
        if self.online is None:
            return super().decision_steps
        return [] if self.online.step is None else [self.online.step]

    def should_check(self, step: int) -> bool:
        if self.online is None:
            return super().should_check(step)
        return step == self.online.step

    def observe(self, record: GroupRecord) -> None:
        if self.online is not None:
            self.online.observe(record)

    def metrics(self) -> dict[str, float]:
        return self.online.metrics() if self.online is not None else {}

    def decide(self, group: GroupView) -> GateDecision:
        frac = termination_frac(group.actions, group.step, group.ended)
        limit = self.params.max_finished_frac
        features = {"termination_frac": frac}
        if limit < 0:
            return GateDecision(False, "max_finished_frac < 0: never stops", features)
        stop = frac <= limit
        op = "<=" if stop else ">"
        return GateDecision(stop, f"finished by step {group.step}: {frac:.2f} {op} {limit}", features)

    @classmethod
    def calibrate(cls, fit: Sequence[GroupRecord], cal: Calibration) -> dict[str, Any]:
        """The step and the share that save the most on ``fit`` at the target precision; off (-1)
        if none does. The step is the evaluation's K or any later one the fit part reaches: how
        late a group must still be unfinished to be judged stalled is what sets the precision
        (a success that comes after the step is a false stop), so it is calibrated, not fixed."""
        first = cal.shared.get("k", cls.Params.model_fields["k"].default)
        longest = max((len(t.steps) for g in fit for t in g.trajectories), default=first)
        # the shares a group can have: i finished of its G
        shares = sorted({i / g.g for g in fit for i in range(g.g + 1)})
        # a schedule of later steps (--steps) fixes K: the later steps must stay after it
        steps = [first] if cal.shared.get("steps") else range(first, max(first, longest - 1) + 1)
        online = cal.online is not None and not cal.shared.get("steps")
        if online and cal.prior is not None:  # a given prior: nothing is fitted
            best = {"k": cal.prior, "max_finished_frac": 0.0}
        else:
            grid = [{"k": k, "max_finished_frac": t} for k in steps for t in shares]
            best = best_params(cls.name, [{"max_finished_frac": -1.0}, *grid], fit, cal)[0]
        if not online:
            return best
        # online: the fitted step is the prior; where none was precise enough, the latest step is
        first, last = cal.online  # type: ignore[misc]
        if best["max_finished_frac"] < 0:
            best = {"k": last, "max_finished_frac": 0.0}
        k = best["k"]
        return {**best, "online": [min(first, k), max(last, k)], "target": cal.target}
