"""A gymnasium text environment that the tests register themselves, as a third-party package
registers its own: importing this module (``env.imports=[tests.env.gym_doors_env]``) runs its
``gymnasium.register`` call in whichever process imports it.

An episode is a room of doors named after its seed; ``info["admissible_commands"]`` lists what
can be done. It ends (terminated) after two steps, rewarding the last with 1.0 in every other
instance a process makes and 0.0 in the rest: the G >= 2 episodes of a group, made one after
another on one env worker, always split, whatever the policy picks."""

from __future__ import annotations

import itertools
import string
from typing import Any, ClassVar

import gymnasium
from gymnasium import spaces

ENV_ID = "SrTest/Doors-v0"
COMMANDS = ["open the red door", "open the blue door", "look"]
_made = itertools.count()


class DoorsEnv(gymnasium.Env):
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Text(max_length=500, charset=string.printable)
        self.action_space = spaces.Text(max_length=500, charset=string.printable)
        self.paying = next(_made) % 2 == 0
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return f"You are in room {seed}. There are two doors.", {"admissible_commands": list(COMMANDS)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.steps += 1
        terminated = self.steps >= 2
        reward = 1.0 if terminated and self.paying else 0.0
        return f"You chose: {action}.", reward, terminated, False, {"admissible_commands": list(COMMANDS)}


gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:DoorsEnv")
