"""Config of the gate (selective_rollout.gate)."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class GateConfig(Section):
    name: Literal["none", "prefix_edit", "two_axis"] = "prefix_edit"
    k: int = Field(10, ge=1, description="step at which the gate looks (K)")
    tau: float = Field(0.12, ge=0.0, le=1.0, description="prefix_edit: stop when D_K < tau")
    d_low: float = Field(0.12, ge=0.0, le=1.0, description="two_axis: stop when D_K < d_low")
    t_high: float = Field(0.9, ge=0.0, le=1.0, description="two_axis: or when terminated fraction >= t_high")
    mode: Literal["at_k", "from_k"] = "at_k"

    def params(self) -> dict[str, object]:
        """Constructor arguments of the selected gate."""
        if self.name == "none":
            return {}
        if self.name == "prefix_edit":
            return {"k": self.k, "tau": self.tau, "mode": self.mode}
        return {"k": self.k, "d_low": self.d_low, "t_high": self.t_high, "mode": self.mode}
