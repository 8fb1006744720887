"""In-process ALFWorld episodes shared by the integrations (OpenRLHF agent, inference loop).

textworld's grammar parser (tatsu) is not thread-safe, and episodes are stepped in worker
threads so an event loop keeps generating meanwhile: episodes of one process take turns.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from alfworld_env.engine import Observation
from selective_rollout.envs.alfworld import GAME_FILE, AlfworldSource
from selective_rollout.envs.base import Episode, folder_task

_TEXTWORLD_LOCK = threading.Lock()


def _locked(fn: Any, *args: Any) -> Any:
    with _TEXTWORLD_LOCK:
        return fn(*args)


class ThreadedEpisode:
    """One episode of a game folder, reset/step/close off the event loop, one at a time per process."""

    def __init__(self, episode: Episode) -> None:
        self._episode = episode

    @classmethod
    async def open(cls, game_dir: str | Path) -> tuple[ThreadedEpisode, Observation]:
        game_file = Path(game_dir) / GAME_FILE
        if not game_file.is_file():
            raise FileNotFoundError(f"not an ALFWorld game folder (no game.tw-pddl): {game_dir}")
        task = folder_task(str(game_dir), str(game_dir), "")
        (episode,) = await asyncio.to_thread(_locked, AlfworldSource().open, task, 1)
        return cls(episode), await asyncio.to_thread(_locked, episode.reset)

    async def step(self, command: str) -> Observation:
        return await asyncio.to_thread(_locked, self._episode.step, command)

    async def close(self) -> None:
        await asyncio.to_thread(_locked, self._episode.close)
