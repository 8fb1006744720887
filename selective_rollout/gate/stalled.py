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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from selective_rollout.gate.base import Calibration, Gate, GateDecision, GateParams, GroupState
from selective_rollout.gate.calibration import best_params
from selective_rollout.gate.features import termination_frac
from selective_rollout.records import GroupRecord


class StalledParams(GateParams):
    max_finished_frac: float = Field(
        0.0,
        ge=-1.0,
        le=1.0,
        description="stop when at most this share of the G trajectories has finished by step K "
        "(0: only groups none of which has; < 0: never stop)",
    )


class StalledGate(Gate):
    """Stop when no more than ``max_finished_frac`` of the G trajectories has finished by step K."""

    Params = StalledParams
    threshold = "max_finished_frac"
    params: StalledParams

    def decide(self, group: GroupState) -> GateDecision:
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
        grid = [{"k": k, "max_finished_frac": t} for k in steps for t in shares]
        return best_params(cls.name, [{"max_finished_frac": -1.0}, *grid], fit, cal)[0]
