"""The rollout-source contract: what the learner's groups come from, as the driver sees it.

One method, typed input and output: ``rollout(tasks, iteration)`` plays groups from the task list
(in order) until the iteration's batch is complete and returns a ``RolloutBatch``. The concurrent
coordinator (rollout/coordinator.py) and the paper's lock-step loop (rollout/lockstep.py) are two
implementations, so an A/B of the two compares classes, not flags.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from selective_rollout.records import Experience, GroupRecord, Task
from selective_rollout.registry import Registry

# a rollout schedule: how a batch's groups are played (``rollout.mode``), a ``GroupScheduler``
# built with the run's config, engines, env pool and agent (its parameters are rollout.* keys);
# lines of selective_rollout.plugins or entry points of the group "selective_rollout.rollout_modes"
ROLLOUT_MODES: Registry = Registry(
    "rollout mode",
    "selective_rollout.rollout_modes",
    base="selective_rollout.rollout.scheduler:GroupScheduler",
    params_attr=None,
    catalog="selective_rollout.plugins:ROLLOUT_MODE_CATALOG",
)


@dataclass
class RolloutBatch:
    """What one iteration's rollout hands the learner and the logger."""

    experiences: list[Experience]
    groups: list[GroupRecord]
    metrics: dict[str, float]
    tasks_consumed: int  # how far the task cursor moved (skipped tasks included)
    kept_group_ids: list[str] = field(default_factory=list)
    # a stream's batch (driver.pipeline=stream): the stream indices of the tasks it settled
    stream_indices: list[int] = field(default_factory=list)


class RolloutSource(ABC):
    """Turns the next tasks of the stream into one iteration's batch."""

    @abstractmethod
    async def rollout(self, tasks: Sequence[Task], iteration: int = 0, version: int = 0) -> RolloutBatch:
        """Play groups from ``tasks``, in order, until the batch is complete (``iteration`` < 0
        marks a held-out evaluation: its group ids say ``eval``), under weights of policy
        ``version`` (learner updates seen), which every group and experience carries."""
