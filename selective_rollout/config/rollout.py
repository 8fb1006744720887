"""Config of the rollout source (selective_rollout.rollout: the coordinator or the lock-step loop).

``rollout.strategy`` names an entry of the strategy registry (``STRATEGIES``)
and the selected strategy's own parameters are flat keys of this section (``rollout.preskip_window``),
declared by the strategy's ``Params``, so a new strategy needs no change here.
"""

from pydantic import Field, field_validator

from selective_rollout.config.base import EntrySection
from selective_rollout.registry import load

ROLLOUT_MODES_AT = "selective_rollout.rollout.source:ROLLOUT_MODES"  # loaded on use, as the strategies


class RolloutConfig(EntrySection):
    """The rollout source: which groups run, how many at once, what enters the batch.

    Besides the keys below, the selected strategy's own parameters are keys of this section."""

    selector = "strategy"
    registry_at = "selective_rollout.rollout.strategies:STRATEGIES"

    strategy: str = Field(
        "selective",
        description="a registered strategy: none | dapo (post-hoc zero-variance filter) | preskip | "
        "selective (gate) | selective+dapo (both), or your own; its own keys are listed below. The "
        "strategy decides whether the gate is consulted: an ungated one (none, dapo, preskip) is how "
        "the gate is turned off (gate.name=none is a deprecated spelling of that)",
    )
    mode: str = Field(
        "concurrent",
        description="the rollout schedule, a registered one: concurrent (rollout.coordinator."
        "GroupCoordinator) or lockstep (rollout.lockstep.LockstepRollout, the paper's loop: one group "
        "at a time, all G in lock-step), or your own GroupScheduler (a module:Class path or an entry "
        "point of selective_rollout.rollout_modes)",
    )
    group_size: int = Field(8, ge=2, description="G: trajectories per task")
    groups_per_iteration: int = Field(4, ge=1, description="target trainable groups per iteration")
    refill: bool = Field(True, description="start a new task whenever a group is cut or filtered")
    max_groups_factor: float = Field(
        3.0, ge=1.0, description="cap on groups started per iteration, as a multiple of the target"
    )
    max_groups_in_flight: int = Field(4, ge=1)
    max_steps: int = Field(15, ge=1, description="step cap per trajectory (truncation)")
    hold_at_gate: bool = Field(
        True,
        description="concurrent mode, at_k gates: a trajectory that reaches a decision step waits there "
        "until the gate has decided (when the group's slowest live trajectory gets there), so a cut "
        "spends nothing after it; false: each trajectory runs on at its own pace meanwhile",
    )
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
    retry_failed: bool = Field(True, description="retry a group once when its engine or env worker died")
    engine_replace_timeout_s: float = Field(
        600.0, gt=0, description="with every engine dead, how long to wait for the driver's replacement"
    )

    @field_validator("mode")
    @classmethod
    def _registered_mode(cls, value: str) -> str:
        modes = load(ROLLOUT_MODES_AT)
        if value not in modes:
            raise ValueError(modes.unknown(value))
        if ":" in value:  # a schedule named by its path: imported now, so a typo is a config error
            modes.get(value)
        return value

    @property
    def uses_gate(self) -> bool:
        """Whether the selected strategy consults the gate (so the gate's settings matter)."""
        return bool(self.selectors()[self.selector].get(self.strategy).uses_gate)
