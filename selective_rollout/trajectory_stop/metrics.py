"""The rollout metrics of trajectory stops (``trajectory_stop/*``), from the recorded groups."""

from __future__ import annotations

from collections.abc import Sequence

from selective_rollout.records import GroupRecord, Trajectory, TrajectoryStatus


def saved_estimate(trajectory: Trajectory, cap: int) -> int:
    """Step-tokens a stopped trajectory did not spend, estimated as the steps it had left to the
    episode cap times the step-tokens of its own last step.

    A trajectory whose label is right runs to the cap in ALFWorld (an episode ends early only when
    won), and each later turn's prompt holds the dialogue so far (up to the agent's history window),
    so a later step costs at least what its last one did: the estimate is low per step for a right
    label. A wrongly labelled trajectory would have ended sooner, by winning, so for it the count
    of steps is high. Audited stops measure the real figure (their step-tokens after the stop step).
    """
    if trajectory.stop is None or not trajectory.steps:
        return 0
    return max(0, cap - trajectory.stop.step) * trajectory.steps[-1].step_tokens


def stop_metrics(records: Sequence[GroupRecord], cap: int) -> dict[str, float]:
    """Trajectories stopped, audited stops whose true reward was measured, the share of those whose
    assigned reward was right (when any), and the step-tokens the stops saved (``saved_estimate``)."""
    trajectories = [t for r in records for t in r.trajectories]
    stopped = [t for t in trajectories if t.status is TrajectoryStatus.STOPPED]
    labels = [t.label_right for t in trajectories if t.label_right is not None]
    metrics = {
        "trajectory_stop/stopped": float(len(stopped)),
        "trajectory_stop/audited": float(len(labels)),
        "trajectory_stop/step_tokens_saved_est": float(sum(saved_estimate(t, cap) for t in stopped)),
    }
    if labels:
        metrics["trajectory_stop/label_precision"] = sum(labels) / len(labels)
    return metrics
