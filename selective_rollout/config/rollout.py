"""Config of the GroupCoordinator (selective_rollout.rollout.coordinator)."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class RolloutConfig(Section):
    strategy: Literal["none", "dapo", "preskip", "selective", "selective+dapo"] = "selective"
    group_size: int = Field(8, ge=2, description="G: trajectories per task")
    groups_per_iteration: int = Field(4, ge=1)
    refill: bool = True
    max_groups_in_flight: int = Field(4, ge=1)
    audit_frac: float = Field(0.0, ge=0.0, le=1.0)
