"""Config of the GroupCoordinator (selective_rollout.rollout.coordinator)."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class RolloutConfig(Section):
    """The GroupCoordinator: which groups run, how many at once, what enters the batch."""

    strategy: Literal["none", "dapo", "preskip", "selective", "selective+dapo"] = Field(
        "selective",
        description="none | dapo (post-hoc zero-variance filter) | preskip | selective (gate) | both",
    )
    mode: Literal["concurrent", "lockstep"] = Field(
        "concurrent", description="lockstep = the paper's loop: one group at a time, all G in lock-step"
    )
    group_size: int = Field(8, ge=2, description="G: trajectories per task")
    groups_per_iteration: int = Field(4, ge=1, description="target trainable groups per iteration")
    refill: bool = Field(True, description="start a new task whenever a group is cut or filtered")
    max_groups_factor: float = Field(
        3.0, ge=1.0, description="cap on groups started per iteration, as a multiple of the target"
    )
    max_groups_in_flight: int = Field(4, ge=1)
    max_steps: int = Field(15, ge=1, description="step cap per trajectory (truncation)")
    audit_budget: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="gate stops run on in shadow (audited) while their cost stays within this share of "
        "the run's step-tokens; the first stop is always audited (0: never audit, 1: audit every stop)",
    )
    audit_target_precision: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="auditing tapers off once the 95% lower bound of the audited precision clears this",
    )
    preskip_window: int = Field(1, ge=1)
    preskip_explore: float = Field(0.1, ge=0.0, le=1.0)
    retry_failed: bool = Field(True, description="retry a group once when its engine or env worker died")
    engine_replace_timeout_s: float = Field(
        600.0, gt=0, description="with every engine dead, how long to wait for the driver's replacement"
    )
