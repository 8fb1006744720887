"""The agent: one ``Conversation`` (rollout.dialogue) per trajectory, action parsing, constrained choice.

The coordinator holds one ``Agent`` and asks it for each trajectory's conversation, for the
sampling parameters of a turn (with the admissible commands as ``choices`` when
``constrain_to_admissible`` is on: SmolLM2-135M emits a valid action only 2-12% of the time
unconstrained) and for the command a reply maps to. A game without an admissible list takes the
reply's action text as is; an environment that gives its own first messages is played with
them, its system prompt in place of the project's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selective_rollout.config.agent import AgentConfig
from selective_rollout.envs.base import Message, PromptText
from selective_rollout.rollout.actions import ParsedAction, parse_action
from selective_rollout.rollout.dialogue import Conversation
from selective_rollout.rollout.engines.base import SamplingParams
from selective_rollout.rollout.engines.trie import ChoiceTries
from selective_rollout.rollout.prompts import PromptBuilder


class Agent:
    """Prompt format, parsing and constrained choice for one model's tokenizer."""

    def __init__(self, cfg: AgentConfig, tokenizer: Any, game: PromptText) -> None:
        self.cfg = cfg
        every_turn = cfg.admissible_in_prompt == "every_turn"
        self.builder = PromptBuilder(tokenizer, cfg.action_format, game, every_turn)
        self.choice_tries = ChoiceTries(tokenizer, self.builder.eot_id)  # each admissible list's, once

    @classmethod
    def from_model(cls, cfg: AgentConfig, model_path: str | Path, game: PromptText) -> Agent:
        """The agent for ``model_path``'s tokenizer, worded for ``game`` (the environment's prompt)."""
        from transformers import AutoTokenizer

        return cls(cfg, AutoTokenizer.from_pretrained(str(model_path)), game)

    def start(
        self, task: str, obs: str, admissible: Sequence[str], messages: Sequence[Message] | None = None
    ) -> Conversation:
        """A trajectory's dialogue from its first observation; ``messages``: the environment's own
        first messages, whose leading system message (if any) replaces the project's prompt."""
        every_turn = self.cfg.admissible_in_prompt == "every_turn"
        builder = self.builder
        if messages is not None:
            has_system = bool(messages) and messages[0].get("role") == "system"
            builder = builder.with_system(messages[0]["content"] if has_system else None)
            messages = messages[1:] if has_system else messages
        return Conversation(
            builder,
            self.cfg.history_turns,
            task,
            obs,
            admissible,
            every_turn,
            self.choice_tries if self.cfg.constrain_to_admissible else None,
            messages,
        )

    def sampling(self, admissible: Sequence[str], base: SamplingParams) -> SamplingParams:
        """``base`` restricted to the admissible commands when constrained choice is on."""
        if self.cfg.constrain_to_admissible and admissible:
            return dataclasses.replace(base, choices=list(dict.fromkeys(admissible)))
        return base

    def parse(self, reply: str, admissible: Sequence[str]) -> ParsedAction:
        return parse_action(reply, admissible, self.cfg.action_format, self.cfg.fuzzy_threshold)
