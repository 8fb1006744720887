"""The trajectory stop contract: decide, inside a group the gate keeps, that one trajectory is
already decided, and with which reward it ends.

The group gate (selective_rollout.gate) stops whole groups, so it never touches a mixed group, and
mixed groups are most of a batch. There a trajectory that has plainly lost (its siblings won long
ago, or it walks in circles) still pays for every step up to the cap. A rule ends it early with the
reward it would most likely get: the learner sees that reward and the tokens the trajectory
generated, and the steps it would have taken are never spent.

A rule answers ``decide(view) -> reward | None`` about one trajectory at one of its steps; the
runner asks only where ``due(step)`` holds (from the shared ``min_step`` on), once per step, and
never about a trajectory that ended. A new rule is one class in a file of its own, with a
``Params`` model, plus one line in ``selective_rollout/plugins.py`` (docs/trajectory_stops.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from selective_rollout.registry import Registry, bind

# every trajectory stop rule by name (lines of selective_rollout.plugins, entry points of the group
# "selective_rollout.trajectory_stops", or a class named by its path)
TRAJECTORY_STOPS: Registry = Registry(
    "trajectory stop",
    "selective_rollout.trajectory_stops",
    base=f"{__name__}:TrajectoryRule",
    params_base=f"{__name__}:TrajectoryStopParams",
    check=f"{__name__}:check_rule",
    catalog="selective_rollout.plugins:TRAJECTORY_STOP_CATALOG",
)


@dataclass(frozen=True)
class TrajectoryView:
    """What a rule may look at: the group as it stands when trajectory ``index`` has taken ``step``
    actions. Per trajectory of the group: its ``actions`` so far, whether it has ``won`` so far and
    whether it has ``ended`` (won, truncated or stopped)."""

    index: int
    step: int
    actions: Sequence[Sequence[str]]
    won: Sequence[bool]
    ended: Sequence[bool]
    g: int

    def __post_init__(self) -> None:
        if not len(self.actions) == len(self.won) == len(self.ended) == self.g:
            raise ValueError(
                f"a view of {self.g} trajectories has {len(self.actions)} action lists, "
                f"{len(self.won)} won flags and {len(self.ended)} ended flags"
            )
        if not 0 <= self.index < self.g:
            raise ValueError(f"trajectory {self.index} is not one of the group's {self.g}")

    @property
    def own_actions(self) -> Sequence[str]:
        """The asked trajectory's first ``step`` actions."""
        return self.actions[self.index][: self.step]

    @property
    def winners(self) -> int:
        """How many of the asked trajectory's siblings have won so far."""
        return sum(bool(w) for j, w in enumerate(self.won) if j != self.index)


class TrajectoryStopParams(BaseModel):
    """The parameters every rule shares. A rule's own parameters extend this model, so that their
    defaults, bounds and descriptions live with the rule and the run config, the offline evaluation
    and the configuration reference read them from there."""

    model_config = ConfigDict(extra="forbid")

    min_step: int = Field(
        6, ge=1, description="no trajectory is stopped before it has taken this many actions"
    )


def check_rule(name: str, cls: type[TrajectoryRule]) -> None:
    """A rule's own refusals at registration (``TRAJECTORY_STOPS`` runs it on load)."""
    if "name" in cls.Params.model_fields:
        raise TypeError(f"trajectory stop {name!r}: a parameter cannot be called 'name' (the rule's name)")


class TrajectoryRule:
    """Interface: whether one trajectory of a running group is already decided.

    A rule exists because a mixed group keeps paying for trajectories whose outcome is plain long
    before they end; it must return a reward only where it would bet on that reward, since a wrong
    label changes the group's advantages (the audit measures how often that happens).
    ``Params`` declares its parameters (its own on top of the shared ``min_step``).
    """

    name: ClassVar[str] = ""  # its registry name, set when the registry loads it
    Params: ClassVar[type[TrajectoryStopParams]] = TrajectoryStopParams

    def __init__(self, params: TrajectoryStopParams | None = None, **values: Any) -> None:
        """Bound to ``params`` (its ``Params``, as ``TRAJECTORY_STOPS.build`` passes) or to keyword
        values, validated by its ``Params`` either way."""
        name = self.name or type(self).__name__
        self.params = bind(self.Params, params, owner=f"trajectory stop {name!r}", **values)

    def due(self, step: int) -> bool:
        """Whether a trajectory that has taken ``step`` actions may be asked about."""
        return step >= self.params.min_step

    def decide(self, view: TrajectoryView) -> float | None:
        """The reward to end trajectory ``view.index`` with now, or None to let it run."""
        raise NotImplementedError


class NoStop(TrajectoryRule):
    """Never stops a trajectory: every trajectory runs until it ends (the default)."""

    def due(self, step: int) -> bool:
        return False

    def decide(self, view: TrajectoryView) -> float | None:
        return None
