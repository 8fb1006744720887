"""In-process ALFWorld episodes shared by the integrations (OpenRLHF agent, inference loop).

textworld's grammar parser (tatsu) is not thread-safe, and episodes are stepped in worker
threads so an event loop keeps generating meanwhile: episodes of one process take turns.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from alfworld_env.engine import Episode, Observation

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
        game_file = Path(game_dir) / "game.tw-pddl"
        if not game_file.is_file():
            raise FileNotFoundError(f"not an ALFWorld game folder (no game.tw-pddl): {game_dir}")
        episode = await asyncio.to_thread(_locked, Episode, json.loads(game_file.read_text()))
        return cls(episode), await asyncio.to_thread(_locked, episode.reset)

    async def step(self, command: str) -> Observation:
        return await asyncio.to_thread(_locked, self._episode.step, command)

    async def close(self) -> None:
        await asyncio.to_thread(_locked, self._episode.close)


def task_of(obs: str) -> str:
    """The task sentence of a first observation (``Your task is to: ...``)."""
    mark = "Your task is to: "
    return obs.split(mark, 1)[1].strip() if mark in obs else ""
