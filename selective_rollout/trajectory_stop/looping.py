"""``looping``: a trajectory whose last actions go round a few commands is stuck."""

from __future__ import annotations

from pydantic import Field

from selective_rollout.trajectory_stop.base import TrajectoryRule, TrajectoryStopParams, TrajectoryView


class LoopingParams(TrajectoryStopParams):
    window: int = Field(6, ge=2, description="how many of its last actions are looked at")
    max_distinct: int = Field(
        2,
        ge=1,
        description="stop when those actions hold at most this many distinct commands (at least "
        "window: every trajectory still running at min_step is stopped)",
    )
    assign: float = Field(0.0, allow_inf_nan=False, description="the reward a stopped trajectory gets")


class LoopingRule(TrajectoryRule):
    """Stop a trajectory whose last ``window`` actions cycle through at most ``max_distinct``
    commands (``go to desk 1`` / ``go to desk 2`` over and over).

    A policy that keeps revisiting the same places has stopped exploring; the text world gives it
    the same observations each time, so it seldom breaks out before the cap. It gets ``assign``
    (a failure's reward).
    """

    Params = LoopingParams
    params: LoopingParams

    def decide(self, view: TrajectoryView) -> float | None:
        last = view.own_actions[-self.params.window :]
        if len(last) < self.params.window or len(set(last)) > self.params.max_distinct:
            return None
        return self.params.assign
