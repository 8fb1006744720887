"""The ``history`` gate: the task's earlier groups as a prior, the current group's D_K as evidence.

On-policy, a task comes back every few iterations and the policy changes slowly, so the outcome
of its last group is a strong prior on the next one (GRESO skips on that prior alone, before the
rollout, and pays in full for its misses). This gate keeps, per task, the last group whose final
rewards are known (uncut or audited: a cut group's outcome is unknown, so it adds nothing) with
its D at each decision step, and at step s of a new group of that task:

- no known earlier group: the plain prefix_edit rule, stop if D_s < ``tau``;
- the last known one was zero-variance: stop if D_s < ``tau_after_zero``, or if D_s is no more
  than that group's D_s plus ``margin`` (it behaves as it did then; ``margin`` < 0 turns this
  part off);
- the last known one was mixed: stop if D_s < ``tau_after_mixed`` (0: never).

It learns through ``Gate.observe`` (the coordinator calls it for every finished group; the
held-out evaluation replays logs in order, so it only sees earlier groups), and needs the task id
in the ``GroupState`` (``GateWatch(task_id=...)``); without one it is the plain gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from selective_rollout.gate.policies import Gate, GateDecision, GateParams, GroupState, register_gate
from selective_rollout.gate.replay import best_params, whole_distance
from selective_rollout.records import GroupRecord

if TYPE_CHECKING:
    from selective_rollout.gate.replay import Calibration


@dataclass(frozen=True)
class Known:
    """A task's last group with known final rewards: its outcome and D at each decision step."""

    zero_variance: bool
    distance: dict[int, float]


class HistoryParams(GateParams):
    tau: float = Field(
        0.12, ge=0.0, le=1.0, description="no known earlier group of the task: stop when D_K < tau"
    )
    tau_after_zero: float = Field(
        0.3, ge=0.0, le=1.0, description="the task's last known group was zero-variance: stop when D_K < this"
    )
    margin: float = Field(
        0.0,
        ge=-1.0,
        le=1.0,
        description="... or when D_K <= that group's D_K + margin (< 0: off)",
    )
    tau_after_mixed: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="the task's last known group was mixed: stop when D_K < this (0: never)",
    )


@register_gate("history")
class HistoryGate(Gate):
    """The task's last group with known rewards as a prior: after a zero-variance one a looser
    D_K threshold (or D_K no higher than then), after a mixed one a tighter one; with no history
    the plain prefix_edit rule."""

    Params = HistoryParams
    threshold = "tau_after_zero"
    params: HistoryParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.known: dict[str, Known] = {}
        self.asked = 0
        self.with_history = 0

    def observe(self, record: GroupRecord) -> None:
        zero = record.zero_variance
        if zero is None or record.g < 2 or not record.task_id:
            return  # cut unaudited (or failed): its outcome is unknown
        # a group with known rewards ran every trajectory to its end
        self.known[record.task_id] = Known(zero, {s: whole_distance(record, s) for s in self.decision_steps})

    def decide(self, group: GroupState) -> GateDecision:
        p, step = self.params, group.step
        d = group.distance(step)
        self.asked += 1
        known = self.known.get(group.task_id) if group.task_id is not None else None
        features = {"prefix_edit_distance": d}
        if known is None:
            stop = d < p.tau
            return GateDecision(
                stop, f"no history: D_{step}={d:.3f} {'<' if stop else '>='} tau={p.tau}", features
            )
        self.with_history += 1
        then = known.distance.get(step)
        features["history_zero_variance"] = float(known.zero_variance)
        if then is not None:
            features["history_distance"] = then
        if not known.zero_variance:
            stop = d < p.tau_after_mixed
            rule = f"after a mixed group: D_{step}={d:.3f} {'<' if stop else '>='} {p.tau_after_mixed}"
            return GateDecision(stop, rule, features)
        if d < p.tau_after_zero:
            return GateDecision(
                True, f"after a zero-variance group: D_{step}={d:.3f} < {p.tau_after_zero}", features
            )
        if p.margin >= 0 and then is not None and d <= then + p.margin:
            return GateDecision(
                True,
                f"after a zero-variance group: D_{step}={d:.3f} <= then {then:.3f} + {p.margin}",
                features,
            )
        return GateDecision(False, f"after a zero-variance group: D_{step}={d:.3f}, then {then}", features)

    def metrics(self) -> dict[str, float]:
        used = self.with_history / self.asked if self.asked else 0.0
        return {"history_tasks": float(len(self.known)), "history_used_frac": used}

    @classmethod
    def calibrate(cls, fit: Sequence[GroupRecord], cal: Calibration) -> dict[str, Any]:
        """``tau`` as the plain gate's on ``fit``; then the history thresholds that save the most at
        the target precision, replaying ``fit`` in order (so only earlier groups are history)."""
        taus = list(cal.thresholds)
        (plain, _) = best_params("prefix_edit", [{"tau": t} for t in taus], fit, cal)
        tau = plain["tau"]
        grid = [
            {"tau": tau, "tau_after_zero": round(float(z), 2), "margin": m, "tau_after_mixed": mixed}
            for mixed in (0.0, tau)
            for m in (-1.0, 0.0, 0.05, 0.1, 0.2)
            for z in np.arange(0.0, 1.0001, 0.05)
            if z >= tau or z == 0.0
        ]
        grid.append(
            {"tau": 0.0, "tau_after_zero": 0.0, "margin": -1.0, "tau_after_mixed": 0.0}
        )  # never stops
        return best_params(cls.name, grid, fit, cal)[0]
