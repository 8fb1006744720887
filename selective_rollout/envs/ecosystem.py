"""What the adapters for environments written for other libraries share (``envs/skyrl.py`` for
skyrl-gym, ``envs/gym_text.py`` for gymnasium): the modules a user names to be imported in every
env worker before an environment is made (so a package's ``register`` calls run there), the
observation they report, and the stated rules: a trajectory's reward is the sum of its steps'
rewards (as SkyRL sums them), and an episode is won when the environment itself ended it with a
positive summed reward (a truncation, by the environment's time limit or ``rollout.max_steps``,
never wins)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from selective_rollout.envs.base import Environment, EnvParams, EpisodeState, Message, PromptText, TaskError


class EcosystemParams(EnvParams):
    imports: list[str] = Field(
        default_factory=list,
        description="modules imported in every env worker before an environment is made, so that a "
        "package's register calls run there (your environments' module, say)",
    )


def import_all(modules: Sequence[str]) -> None:
    """Import ``modules`` in this process; a missing one is one line naming it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise TaskError(f"env.imports: cannot import {name!r}: {exc}") from None


@dataclass
class Shown:
    """One observation of an adapted environment (the seam's ``Observation``, with its optional
    ``reward`` and ``messages``)."""

    obs: str
    admissible: list[str]
    reward: float = 0.0
    done: bool = False
    won: bool = False
    messages: list[Message] | None = None


@dataclass
class Return:
    """An episode's summed reward so far, and what a step shows under the stated rules."""

    total: float = 0.0

    def after(
        self,
        obs: str,
        admissible: list[str],
        reward: Any,
        ended: bool,
        truncated: bool = False,
        messages: list[Message] | None = None,
    ) -> Shown:
        """The observation of a step that earned ``reward``; ``ended``: the environment ended the
        episode, ``truncated``: its time limit did."""
        self.total += float(reward)
        won = bool(ended) and self.total > 0
        return Shown(obs, admissible, float(reward), bool(ended or truncated), won, messages)


def text_of(messages: Sequence[Message]) -> str:
    """The text of chat messages (what the logs and the task sentence read)."""
    return "\n\n".join(str(m.get("content", "")) for m in messages)


class EcosystemEnvironment(Environment):
    """An adapted environment: free-text unless its observations list commands, rewarded by the
    sum of its steps' rewards. Neither has folders of games nor walkthroughs."""

    prompt = PromptText(world="a text environment", commands="", free_text=True)

    def trajectory_reward(self, step_rewards: Sequence[float], final: EpisodeState) -> float:
        return float(sum(step_rewards))
