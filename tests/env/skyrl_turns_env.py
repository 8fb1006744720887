"""A multi-turn skyrl-gym environment that the tests register themselves, as a third-party package
registers its own: importing this module (``env.imports=[tests.env.skyrl_turns_env]``) runs its
``skyrl_gym.register`` call in whichever process imports it.

An episode opens with its own system message before the row's prompt, hears ``max_turns`` replies
(``extra_info.max_turns``, default 2) and rewards each with 0.5 in every other instance a process
makes and 0.0 in the rest: the G >= 2 episodes of a group, made one after another on one env
worker, always split, whatever the policy says."""

from __future__ import annotations

import itertools
from typing import Any

from skyrl_gym import register
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

ENV_ID = "sr_test_turns"
SYSTEM = "You are in a conversation game. Answer in one short sentence."
_made = itertools.count()


class TurnsEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.max_turns = int((extras.get("extra_info") or {}).get("max_turns", 2))
        self.paying = next(_made) % 2 == 0
        self.heard: list[str] = []

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, *prompt], {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        self.heard.append(action)
        done = self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": f"Turn {self.turns} heard. Go on."}]
        reward = 0.5 if self.paying else 0.0
        return BaseTextEnvStepOutput(observations=observations, reward=reward, done=done, metadata={})


register(id=ENV_ID, entry_point=f"{__name__}:TurnsEnv")
