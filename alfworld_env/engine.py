"""One ALFWorld text episode on the real engine: textworld's PDDL env behind ALFWorld's wrappers.

The wrappers are built fresh per episode (ALFWorld shares wrapper *instances* across a batch,
which makes every copy drive one game). Importing ``alfworld`` sets ``ALFWORLD_DATA`` and makes a
cache folder in the home directory; nothing here depends on either.
"""

from __future__ import annotations

import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
from textworld.envs.pddl import PddlEnv

from alfworld_env.errors import as_game_error
from alfworld_env.observation import Observation

REQUEST_INFOS = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
NOTHING_HAPPENS = "Nothing happens."

__all__ = ["NOTHING_HAPPENS", "Episode", "Observation"]


class Episode:
    """A playable copy of one game; copies of the same game share nothing mutable."""

    def __init__(self, game: str | dict) -> None:
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(REQUEST_INFOS)))
        with as_game_error("load"):
            self._env.load(game)

    def reset(self) -> Observation:
        with as_game_error("reset"):
            return self._observe(self._env.reset())

    def step(self, command: str) -> Observation:
        with as_game_error(f"step {command!r}"):
            state, _, _ = self._env.step(command)
            return self._observe(state)

    def names(self) -> dict[str, str]:
        """Engine id (lower-case, mangled) -> the name the player sees, e.g. ``apple 1``."""
        return {k: info.name.strip() for k, info in self._env.unwrapped._entity_infos.items()}

    def close(self) -> None:
        self._env.close()

    @staticmethod
    def _observe(state) -> Observation:
        return Observation(state.feedback.strip(), list(state["admissible_commands"]), bool(state["won"]))
