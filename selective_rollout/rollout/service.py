"""The rollout side as the driver sees it: one contract for every pipeline.

The driver never reaches into the rollout source, the env pool or the engines' slots: it asks a
``RolloutService`` (the coordinator actor, ``rollout/coordinator.py``, is the one shipped) for a
batch played under a given policy version (or batches of a continuous stream), a held-out
evaluation, the engines' health and their replacement, the environment's figures and a clean
shutdown. ``driver.pipeline`` decides when
these are asked (``driver/pipeline.py``), never how they are done; ``rollout.mode`` decides how a
batch's groups are played (``ROLLOUT_MODES``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from selective_rollout.records import GroupRecord, Task
from selective_rollout.rollout.source import RolloutBatch
from selective_rollout.rollout.stream import StreamStart


class RolloutService(ABC):
    """Every method is async (a Ray actor's remote call from the driver)."""

    # -- playing ----------------------------------------------------------------------------
    @abstractmethod
    async def rollout(self, tasks: Sequence[Task], iteration: int, version: int = 0) -> RolloutBatch:
        """One batch of settled groups from ``tasks`` (in order), played under policy ``version``
        (the learner updates the engines' weights have seen), for ``iteration``."""

    @abstractmethod
    async def open_stream(self, start: StreamStart) -> None:
        """``driver.pipeline=stream``: start playing groups without a break from where ``start``
        says, filling batches as groups settle, under the staleness bound (``rollout/stream.py``)."""

    @abstractmethod
    async def take(self, iteration: int, learner_version: int) -> RolloutBatch:
        """The stream's batch ``iteration`` once complete, to be trained at ``learner_version``;
        the groups playing meanwhile go on."""

    @abstractmethod
    async def close_stream(self) -> None:
        """Stop the stream: groups in flight are cancelled and batches not taken never logged."""

    @abstractmethod
    async def evaluate(self, tasks: Sequence[Task]) -> list[GroupRecord]:
        """Held-out episodes with the engines' current weights: one group of ``eval.tries`` per
        task, no gate, no stop (the evaluation's own config)."""

    @abstractmethod
    async def progress(self) -> tuple[int, int]:
        """Tokens generated and env steps taken so far, training and evaluation together: the
        driver's liveness probe (no progress for ``driver.stall_timeout_s`` stops the run)."""

    # -- engines ----------------------------------------------------------------------------
    @abstractmethod
    async def dead_engines(self) -> list[int]:
        """Slots whose engine died (the driver starts a replacement with the current weights)."""

    @abstractmethod
    async def replace_engine(self, index: int, engine: Any) -> None:
        """A fresh engine takes over slot ``index``; groups that failed with the old one retry."""

    @abstractmethod
    async def weights_updated(self, version: int) -> None:
        """The engines now serve policy ``version``, possibly sent while a rollout plays
        (``driver.sync_in_flight``): every group started from now on carries it."""

    # -- figures and operations ---------------------------------------------------------------
    @abstractmethod
    async def env_metrics(self) -> dict[str, float]:
        """The env workers' figures since the start (``env/*``)."""

    @abstractmethod
    async def placement(self) -> dict[str, list[dict[str, Any]]]:
        """Where the service and its env workers run (``placement.json``)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Cancel what is in flight (no half group reaches the log) and stop the env workers."""
