"""The ``history`` gate: the task's earlier groups, and its type's, as a prior; the current group's
D_K as evidence.

On-policy, a task comes back every few iterations and the policy changes slowly, so the outcome
of its last group is a strong prior on the next one (GRESO skips on that prior alone, before the
rollout, and pays in full for its misses). Tasks of one family (ALFWorld's task types: the policy
may have mastered pick-and-place and be lost at cooling) behave alike too, and a family comes
back far sooner than a task. This gate keeps, per task, the last group whose final rewards are
known (uncut or audited: a cut group's outcome is unknown, so it adds nothing) with its D at each
decision step, and per task type the outcomes of its last ``type_window`` known groups; at step s
of a new group:

- the task has a known earlier group (the most specific evidence decides):
  - it was zero-variance: stop if D_s < ``tau_after_zero``, or if D_s is no more than that
    group's D_s plus ``margin`` (it behaves as it did then; ``margin`` < 0 turns this part off);
  - it was mixed: stop if D_s < ``tau_after_mixed`` (0: never);
- else, its type has at least ``type_min_known`` known groups of which at least
  ``type_zero_share`` were zero-variance: stop if D_s < ``tau_after_type_zero``;
- else the plain prefix_edit rule: stop if D_s < ``tau``.

A stop that only the history made (the plain rule would have let the group run) hides the
group's outcome, so a prior could go on cutting a task type long after the policy learned it:
every ``recheck_every``-th such stop per task type runs on instead, and its outcome renews the
history (the audit does this too, but stops auditing once the gate's precision is certified).

It learns through ``Gate.observe`` (the coordinator calls it for every finished group; the
held-out evaluation replays logs in order, so it only sees earlier groups), and needs the task id
and type in the ``GroupView`` (``GateWatch(task_id=..., task_type=...)``); without them it is the
plain gate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from selective_rollout.gate.base import Calibration, Gate, GateDecision, GateParams, GroupView
from selective_rollout.gate.calibration import best_params
from selective_rollout.gate.snapshot import whole_distance
from selective_rollout.records import GroupRecord


@dataclass(frozen=True)
class Known:
    """A task's last group with known final rewards: its outcome and D at each decision step."""

    zero_variance: bool
    distance: dict[int, float]


class HistoryParams(GateParams):
    tau: float = Field(
        0.12,
        ge=0.0,
        le=1.0,
        description="no known earlier group of the task and no type prior that holds: stop when D_K < tau",
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
    type_window: int = Field(
        8, ge=0, description="known groups per task type kept as the type's prior (0: no type prior)"
    )
    type_min_known: int = Field(5, ge=1, description="known groups a task type needs before its prior counts")
    type_zero_share: float = Field(
        0.85,
        ge=0.0,
        le=1.0,
        description="a task of a type whose known groups were zero-variance at least this often ...",
    )
    tau_after_type_zero: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="... and with no known group of its own: stop when D_K < this (0: never)",
    )
    recheck_every: int = Field(
        5,
        ge=0,
        description="every n-th stop that only the history made (per task type) runs on instead, so "
        "the history keeps learning whether the policy still behaves as it did (0: never)",
    )

    @model_validator(mode="after")
    def _window_holds_enough(self) -> HistoryParams:
        if self.type_window and self.type_min_known > self.type_window:
            raise ValueError(
                f"type_min_known={self.type_min_known} > type_window={self.type_window}: "
                "the type prior could never count"
            )
        return self


class HistoryGate(Gate):
    """The task's last group with known rewards as a prior: after a zero-variance one a looser
    D_K threshold (or D_K no higher than then), after a mixed one a tighter one; a task never seen
    whose type mostly converged, its own threshold; with no history the plain prefix_edit rule."""

    Params = HistoryParams
    threshold = "tau_after_zero"
    params: HistoryParams

    def __init__(self, params: GateParams | None = None, **values: Any) -> None:
        super().__init__(params, **values)
        self.known: dict[str, Known] = {}
        self.by_type: dict[str, deque[bool]] = {}  # per task type: its last known outcomes (zero variance?)
        self.asked = 0
        self.with_history = 0
        self.with_type = 0
        self.prior_stops: dict[str, int] = {}  # per task type (or task): stops only the history made
        self.rechecks = 0

    def observe(self, record: GroupRecord) -> None:
        zero = record.zero_variance
        if zero is None or record.g < 2 or not record.task_id:
            return  # cut unaudited (or failed): its outcome is unknown
        # a group with known rewards ran every trajectory to its end
        self.known[record.task_id] = Known(zero, {s: whole_distance(record, s) for s in self.decision_steps})
        if record.task_type and self.params.type_window:
            window = self.by_type.setdefault(record.task_type, deque(maxlen=self.params.type_window))
            window.append(zero)

    def type_zero_share(self, task_type: str | None) -> float | None:
        """The share of zero-variance groups among the type's last known ones; None while it has
        fewer than ``type_min_known`` (or the type is unknown)."""
        window = self.by_type.get(task_type) if task_type else None
        if window is None or len(window) < self.params.type_min_known:
            return None
        return sum(window) / len(window)

    def decide(self, group: GroupView) -> GateDecision:
        decision = self._decide(group)
        d = decision.features["prefix_edit_distance"]
        if not decision.stop or d < self.params.tau or not self.params.recheck_every:
            return decision
        key = group.task_type or group.task_id or ""
        self.prior_stops[key] = self.prior_stops.get(key, 0) + 1
        if self.prior_stops[key] % self.params.recheck_every:
            return decision
        self.rechecks += 1
        return GateDecision(
            False, f"{decision.reason}; rechecked: runs on to renew the history", decision.features
        )

    def _decide(self, group: GroupView) -> GateDecision:
        p, step = self.params, group.step
        d = group.distance(step)
        self.asked += 1
        known = self.known.get(group.task_id) if group.task_id is not None else None
        features = {"prefix_edit_distance": d}
        if known is None:
            share = self.type_zero_share(group.task_type)
            if share is not None:
                features["type_zero_share"] = share
            if share is not None and share >= p.type_zero_share:
                self.with_type += 1
                stop = d < p.tau_after_type_zero
                rule = f"{share:.0%} of {group.task_type} groups zero-variance: D_{step}={d:.3f}"
                return GateDecision(stop, f"{rule} {'<' if stop else '>='} {p.tau_after_type_zero}", features)
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
        asked = self.asked or 1
        return {
            "history_tasks": float(len(self.known)),
            "history_used_frac": self.with_history / asked,
            "history_type_used_frac": self.with_type / asked,
            "history_rechecks": float(self.rechecks),
        }

    @classmethod
    def calibrate(cls, fit: Sequence[GroupRecord], cal: Calibration) -> dict[str, Any]:
        """``tau`` as the plain gate's on ``fit``; then the task's history thresholds that save the
        most at the target precision, replaying ``fit`` in order (so only earlier groups are
        history), with the type prior off; then, those fixed, the type prior's."""
        taus = list(cal.thresholds)
        (plain, _) = best_params("prefix_edit", [{"tau": t} for t in taus], fit, cal)
        tau = plain["tau"]
        thresholds = [round(float(z), 2) for z in np.arange(0.0, 1.0001, 0.05)]
        grid = [
            {"tau": tau, "tau_after_zero": z, "margin": m, "tau_after_mixed": mixed, "type_window": 0}
            for mixed in (0.0, tau)
            for m in (-1.0, 0.0, 0.05, 0.1, 0.2)
            for z in thresholds
            if z >= tau or z == 0.0
        ]
        never = {"tau": 0.0, "tau_after_zero": 0.0, "margin": -1.0, "tau_after_mixed": 0.0, "type_window": 0}
        task_level = best_params(cls.name, [*grid, never], fit, cal)[0]
        window = cls.Params.model_fields["type_window"].default
        typed = [
            {**task_level, "type_window": window, "type_zero_share": share, "tau_after_type_zero": z}
            for share in (0.8, 0.9, 1.0)
            for z in thresholds
            if z > 0
        ]
        return best_params(cls.name, [task_level, *typed], fit, cal)[0]
