"""The paper's gate: stop a group when the prefix edit distance of its actions at step K, D_K,
is below ``tau`` (the paper: 0.12 at K = 10 of 30 steps)."""

from __future__ import annotations

from pydantic import Field

from selective_rollout.gate.base import Gate, GateDecision, GateParams, GroupView


class PrefixEditParams(GateParams):
    tau: float = Field(0.12, ge=0.0, le=1.0, description="stop when D_K < tau (the paper: 0.12)")


class PrefixEditGate(Gate):
    """The paper's one-parameter gate: stop when D_K < tau."""

    Params = PrefixEditParams
    threshold = "tau"
    params: PrefixEditParams

    def decide(self, group: GroupView) -> GateDecision:
        tau = self.params.tau
        d = group.distance(group.step)
        stop = d < tau
        op = "<" if stop else ">="
        return GateDecision(stop, f"D_{group.step}={d:.3f} {op} tau={tau}", {"prefix_edit_distance": d})
