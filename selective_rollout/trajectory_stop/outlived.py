"""``outlived``: a trajectory still running after its siblings have won has most likely lost."""

from __future__ import annotations

from pydantic import Field

from selective_rollout.trajectory_stop.base import TrajectoryRule, TrajectoryStopParams, TrajectoryView


class OutlivedParams(TrajectoryStopParams):
    min_winners: int = Field(1, ge=1, description="stop once at least this many of its siblings have won")
    assign: float = Field(0.0, allow_inf_nan=False, description="the reward a stopped trajectory gets")


class OutlivedRule(TrajectoryRule):
    """Stop a trajectory that has not won while at least ``min_winners`` of its siblings have.

    In ALFWorld an episode ends before the cap only when it is won, so a sibling that won early
    shows the task is short, and a trajectory still wandering at the same step has most likely
    missed the way: it gets ``assign`` (a failure's reward) instead of running to the cap.
    """

    Params = OutlivedParams
    params: OutlivedParams

    def decide(self, view: TrajectoryView) -> float | None:
        if view.won[view.index] or view.winners < self.params.min_winners:
            return None
        return self.params.assign
