"""One ALFWorld text episode on the real engine: textworld's PDDL env behind ALFWorld's wrappers.

The wrappers are built fresh per episode (ALFWorld shares wrapper *instances* across a batch,
which makes every copy drive one game). Importing ``alfworld`` sets ``ALFWORLD_DATA`` and makes a
cache folder in the home directory; nothing here depends on either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
from textworld.envs.pddl import PddlEnv

from alfworld_env.errors import GameError

REQUEST_INFOS = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
NOTHING_HAPPENS = "Nothing happens."


@dataclass
class Observation:
    obs: str
    admissible: list[str]
    won: bool


class Episode:
    """A playable copy of one game; copies of the same game share nothing mutable."""

    def __init__(self, game: str | dict) -> None:
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(REQUEST_INFOS)))
        with _as_game_error("load"):
            self._env.load(game)

    def reset(self) -> Observation:
        with _as_game_error("reset"):
            return self._observe(self._env.reset())

    def step(self, command: str) -> Observation:
        with _as_game_error(f"step {command!r}"):
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


@contextmanager
def _as_game_error(what: str) -> Iterator[None]:
    try:
        yield
    except GameError:
        raise
    except Exception as exc:  # the engine raises parser, planner and KeyError types alike
        raise GameError(f"the engine failed to {what}: {type(exc).__name__}: {exc}") from None
