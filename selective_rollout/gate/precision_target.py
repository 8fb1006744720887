"""The ``precision_target`` gate: the prefix_edit rule D_K < tau with tau set online, from the run's
own labelled groups, so that the lower confidence bound of its precision stays above a target.

The paper's tau is one hand-set number; how precise it is depends on the task distribution and
the policy, which the run's audits measure. This gate keeps (D_K, zero variance?) of every
finished group whose final rewards are known: audited stops (D_K < tau, run on in shadow) and
uncut groups (D_K >= tau, or never stopped). After each, tau becomes the largest value whose
cut set, the known groups with D_K < tau, has an exact (Clopper-Pearson) lower bound of
precision >= ``target``, never below ``tau_start`` nor above ``tau_max``. It starts at
``tau_start`` (0: no cut until the evidence is in) and loosens only as labelled groups
accumulate; new evidence against it tightens it again.

Groups below the current tau are known only when audited, so they are under-represented in the
estimate; where P(zero variance | D_K) falls as D_K grows (what the gate assumes anyway), that
makes the estimate, and so tau, conservative. Its tau, the number of labelled groups and the bound
are gate metrics (``gate/state/tau``, ``gate/state/tau_labelled``,
``gate/state/tau_precision_low``), and each decision's reason and features carry the tau it used,
so rollouts.jsonl holds the trajectory.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from selective_rollout.gate.base import Calibration, Gate, GateDecision, GateParams, GroupView
from selective_rollout.gate.snapshot import whole_distance
from selective_rollout.records import GroupRecord
from selective_rollout.stats import clopper_pearson


class PrecisionTargetParams(GateParams):
    target: float = Field(0.9, ge=0.0, le=1.0, description="keep the lower bound of precision >= this")
    confidence: float = Field(
        0.8,
        gt=0.0,
        lt=1.0,
        description="two-sided Clopper-Pearson level whose lower end is the bound "
        "(0.8: a one-sided 90% bound)",
    )
    tau_start: float = Field(0.0, ge=0.0, le=1.0, description="tau before any evidence (0: no cut)")
    tau_max: float = Field(0.5, ge=0.0, le=1.0, description="tau never exceeds this")


class PrecisionTargetGate(Gate):
    """The prefix_edit rule D_K < tau with tau set online from the run's labelled (audited and
    uncut) groups, the largest whose Clopper-Pearson lower bound of precision stays >= the target."""

    Params = PrecisionTargetParams
    params: PrecisionTargetParams

    def __init__(self, params: GateParams | None = None, **values: Any) -> None:
        super().__init__(params, **values)
        if self.params.tau_start > self.params.tau_max:
            raise ValueError(
                f"gate 'precision_target': tau_start {self.params.tau_start} > tau_max {self.params.tau_max}"
            )
        self.tau = self.params.tau_start
        self.bound = 0.0
        self.labelled: list[tuple[float, bool]] = []  # (D_K, zero variance), sorted by D_K
        self.trajectory: list[tuple[int, float]] = [(0, self.tau)]  # (labelled groups, tau) at each change

    def decide(self, group: GroupView) -> GateDecision:
        d = group.distance(group.step)
        stop = d < self.tau
        op = "<" if stop else ">="
        known = len(self.labelled)
        reason = f"D_{group.step}={d:.3f} {op} tau={self.tau:.3f} (set online from {known} known groups)"
        return GateDecision(stop, reason, {"prefix_edit_distance": d, "tau": self.tau})

    def observe(self, record: GroupRecord) -> None:
        zero = record.zero_variance
        k = self.k
        if zero is None or record.g < 2 or not any(len(t.steps) > k for t in record.trajectories):
            return  # outcome unknown (cut unaudited), or over before K (never asked)
        d = whole_distance(record, k)
        insort(self.labelled, (d, zero))
        self._retune()

    def _retune(self) -> None:
        p = self.params
        best, bound, hits = p.tau_start, 0.0, 0
        for n, (d, zero) in enumerate(self.labelled, start=1):
            hits += zero
            if n < len(self.labelled) and self.labelled[n][0] == d:
                continue  # a cut at tau just above d takes every group at d
            tau = d + 1e-6
            if tau > p.tau_max:
                break
            low = clopper_pearson(hits, n, p.confidence)[0]
            if low >= p.target and tau > best:
                best, bound = tau, low
        if best != self.tau:
            self.trajectory.append((len(self.labelled), best))
        self.tau, self.bound = best, bound

    def metrics(self) -> dict[str, float]:
        return {"tau": self.tau, "tau_labelled": float(len(self.labelled)), "tau_precision_low": self.bound}

    @classmethod
    def calibrate(cls, fit: Sequence[GroupRecord], cal: Calibration) -> dict[str, Any]:
        """Nothing is fit offline: the target is the evaluation's, and tau comes online (the
        held-out evaluation warms the gate up by letting it observe the fit part first)."""
        return {"target": cal.target}
