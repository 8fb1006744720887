"""Config of the gate (selective_rollout.gate)."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class GateConfig(Section):
    """The gate that stops converged groups (used by the selective strategies; docs/gate.md)."""

    name: Literal["none", "prefix_edit", "two_axis"] = Field(
        "prefix_edit",
        description="prefix_edit: the paper's D_K < tau; two_axis: D_K < d_low or terminated >= t_high",
    )
    k: int = Field(10, ge=1, description="step at which the gate looks (K)")
    tau: float = Field(0.12, ge=0.0, le=1.0, description="prefix_edit: stop when D_K < tau")
    d_low: float = Field(0.12, ge=0.0, le=1.0, description="two_axis: stop when D_K < d_low")
    t_high: float = Field(0.9, ge=0.0, le=1.0, description="two_axis: or when terminated fraction >= t_high")
    mode: Literal["at_k", "from_k"] = Field(
        "at_k", description="at_k: decide once at step K (the paper); from_k: at every step >= K"
    )

    def params(self) -> dict[str, object]:
        """Constructor arguments of the selected gate."""
        if self.name == "none":
            return {}
        if self.name == "prefix_edit":
            return {"k": self.k, "tau": self.tau, "mode": self.mode}
        return {"k": self.k, "d_low": self.d_low, "t_high": self.t_high, "mode": self.mode}
