"""Trajectory stop rules: end a trajectory of a running group early with the reward it would most
likely get (docs/trajectory_stops.md). Needs neither Ray nor torch."""

from selective_rollout.trajectory_stop.base import (
    NoStop,
    TrajectoryRule,
    TrajectoryStopParams,
    TrajectoryView,
)

__all__ = ["NoStop", "TrajectoryRule", "TrajectoryStopParams", "TrajectoryView"]
