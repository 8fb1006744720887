"""One TextWorld Cooking episode on the real TextWorld engine (the compiled ``game.z8``, played by
textworld's Z-machine back-end), and the ``EpisodeSource`` that lets the env pool's Ray workers
host such episodes."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import textworld

from alfworld_env.observation import Observation
from selective_rollout.envs.base import Episode, as_task_error, game_dir
from selective_rollout.records import Task

GAME_FILE = "game.z8"
REQUEST_INFOS = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, objective=True)
_BLANK_LINES = re.compile(r"\n\s*\n\s*\n+")


def clean(text: str, objective: str = "") -> str:
    """The engine's text without its ASCII-art banner (hundreds of tokens that say nothing) and
    runs of blank lines; the first observation starts at the objective."""
    if objective and objective in text:
        text = text[text.index(objective) :]
    return _BLANK_LINES.sub("\n\n", text).strip()


class CookingEpisode:
    """A playable copy of one compiled cooking game; copies share nothing mutable."""

    def __init__(self, game_file: str | Path) -> None:
        if not Path(game_file).is_file():
            raise FileNotFoundError(f"no compiled TextWorld game at {game_file}")
        with as_task_error("load"), warnings.catch_warnings():
            # jericho cannot score TextWorld's own games; textworld's Inform 7 wrapper does
            warnings.filterwarnings("ignore", message=".*is not fully supported")
            self._env = textworld.start(str(game_file), REQUEST_INFOS)
        self.objective = ""

    def reset(self) -> Observation:
        with as_task_error("reset"):
            state = self._env.reset()
        self.objective = state["objective"] or ""
        return self._observe(state)

    def step(self, command: str) -> Observation:
        with as_task_error(f"step {command!r}"):
            state, _, _ = self._env.step(command)
        return self._observe(state)

    def close(self) -> None:
        self._env.close()

    def _observe(self, state: textworld.GameState) -> Observation:
        admissible = list(state["admissible_commands"] or [])
        return Observation(
            clean(state.feedback, self.objective), admissible, bool(state["won"]), bool(state["lost"])
        )


@dataclass(frozen=True)
class CookingSource:
    """Cooking games (``<game_dir>/game.z8``) for the pool's workers and the warm start."""

    errors: tuple[type[Exception], ...] = ()  # the episode raises TaskError itself

    def prepare(self) -> None:
        """Nothing to set up: each episode starts its own Z-machine."""

    def open(self, task: Task, n: int) -> list[Episode]:
        return [CookingEpisode(self.describe(task)) for _ in range(n)]

    def task_sentence(self, first: Observation) -> str:
        """The objective: the first paragraph of the first observation."""
        return first.obs.split("\n\n", 1)[0].strip()

    def describe(self, task: Task) -> str:
        return str(game_dir(task) / GAME_FILE)
