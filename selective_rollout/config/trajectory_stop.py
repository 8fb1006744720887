"""Config of the trajectory stop rule (selective_rollout.trajectory_stop).

The section holds the selector ``name``, what every rule shares (``min_step``), the target of the
rule's audits (``audit_target``) and, as flat keys, the selected rule's own parameters
(``trajectory_stop.min_winners=2``), declared by the rule's ``Params`` model and checked by
``EntrySection`` through ``TRAJECTORY_STOPS``, so a new rule needs no change here.
"""

from __future__ import annotations

from pydantic import Field

from selective_rollout.config.base import EntrySection
from selective_rollout.trajectory_stop.base import TRAJECTORY_STOPS, TrajectoryRule, TrajectoryStopParams


class TrajectoryStopConfig(EntrySection):
    """The rule that ends single trajectories of a running group early (docs/trajectory_stops.md).

    It is independent of the gate and of the strategy: any run whose ``name`` is not ``none`` asks
    it about the trajectories of every group the gate has not stopped. Besides ``name``,
    ``min_step`` and ``audit_target``, the selected rule's own parameters are keys of this section;
    any other key is refused with one line naming it. Its audits draw on ``rollout.audit_budget``.
    """

    selector = "name"
    registry_at = "selective_rollout.trajectory_stop.base:TRAJECTORY_STOPS"

    name: str = Field(
        "none",
        description="a registered rule: none (never stops), outlived (not won while siblings have), "
        "looping (its last actions cycle through a few commands), or your own "
        "(docs/trajectory_stops.md); its own keys are listed below",
    )
    min_step: int = TrajectoryStopParams.model_fields["min_step"]
    audit_target: float = Field(
        0.95,
        gt=0.0,
        le=1.0,
        description="stops are audited (run on in shadow, within rollout.audit_budget) until the 95% "
        "lower bound of the rule's label precision clears this",
    )

    def build(self) -> TrajectoryRule:
        """The selected rule with the shared parameters and its own (built once by the rollout
        source; the config only validates the parameters)."""
        return TRAJECTORY_STOPS.build(self.name, self)  # type: ignore[no-any-return]
