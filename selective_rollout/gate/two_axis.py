"""The paper trainer's two-axis rule: stop a group when D_K is below ``d_low`` or when at least
``t_high`` of its trajectories have terminated by step K (the baseline a composed gate must beat)."""

from __future__ import annotations

from pydantic import Field

from selective_rollout.gate.base import Gate, GateDecision, GateParams, GroupView
from selective_rollout.gate.features import termination_frac


class TwoAxisParams(GateParams):
    d_low: float = Field(0.12, ge=0.0, le=1.0, description="stop when D_K < d_low")
    t_high: float = Field(0.9, ge=0.0, le=1.0, description="or when the terminated fraction >= t_high")


class TwoAxisGate(Gate):
    """The paper trainer's OR rule: stop when D_K < d_low or termination fraction >= t_high."""

    Params = TwoAxisParams
    threshold = "d_low"
    params: TwoAxisParams

    def decide(self, group: GroupView) -> GateDecision:
        d_low, t_high = self.params.d_low, self.params.t_high
        d = group.distance(group.step)
        term_frac = termination_frac(group.actions, group.step, group.ended)
        features = {"prefix_edit_distance": d, "termination_frac": term_frac}
        if d < d_low:
            return GateDecision(True, f"D_{group.step}={d:.3f} < d_low={d_low}", features)
        if term_frac >= t_high:
            return GateDecision(True, f"terminated {term_frac:.2f} >= t_high={t_high}", features)
        return GateDecision(False, f"D_{group.step}={d:.3f}, terminated {term_frac:.2f}", features)
