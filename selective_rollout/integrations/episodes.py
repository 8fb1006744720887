"""In-process episodes of any registered environment, shared by the integrations (OpenRLHF agent,
inference loop).

Episodes are stepped in worker threads so an event loop keeps generating meanwhile, and the
episodes of one process take turns: textworld's grammar parser (tatsu), under ALFWorld and
TextWorld Cooking, is not thread-safe, and an engine of another library need not be either.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from selective_rollout.envs.base import Environment, Episode, Observation
from selective_rollout.records import Task

_ENGINE_LOCK = threading.Lock()


def _locked(fn: Any, *args: Any) -> Any:
    with _ENGINE_LOCK:
        return fn(*args)


class ThreadedEpisode:
    """One episode, reset/step/close off the event loop, one at a time per process."""

    def __init__(self, episode: Episode) -> None:
        self._episode = episode

    @classmethod
    async def open_task(cls, environment: Environment, task: Task) -> tuple[ThreadedEpisode, Observation]:
        """An episode of ``task`` of ``environment``; raises ``TaskError`` naming what cannot be played."""
        episode = await asyncio.to_thread(_locked, environment.episode, task)
        return cls(episode), await asyncio.to_thread(_locked, episode.reset)

    async def step(self, command: str) -> Observation:
        return await asyncio.to_thread(_locked, self._episode.step, command)

    async def close(self) -> None:
        await asyncio.to_thread(_locked, self._episode.close)
