"""The agent: one ``Conversation`` per trajectory, action parsing, constrained choice.

The coordinator holds one ``Agent`` and asks it for each trajectory's conversation, for the
sampling parameters of a turn (with the admissible commands as ``choices`` when
``constrain_to_admissible`` is on: SmolLM2-135M emits a valid action only 2-12% of the time
unconstrained) and for the command a reply maps to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selective_rollout.config.agent import AgentConfig
from selective_rollout.envs.alfworld import Alfworld
from selective_rollout.envs.base import PromptText
from selective_rollout.rollout.actions import ParsedAction, parse_action
from selective_rollout.rollout.engines.base import SamplingParams
from selective_rollout.rollout.prompts import PromptBuilder, user_text


class Conversation:
    """One trajectory's dialogue as token ids, kept so that each prompt extends the last.

    Invariant within a segment: ``prompt_{t+1} == prompt_t + completion_t + appended_t``.
    When the history window is full, ``extend`` starts a new segment: a fresh prompt holding the
    task and the last ``history_turns // 2`` exchanges (the window slides in jumps so a segment
    lasts several turns; each segment is one learner sequence and one full prefill).
    """

    def __init__(
        self,
        builder: PromptBuilder,
        history_turns: int,
        task: str,
        obs: str,
        admissible: Sequence[str],
        list_every_turn: bool = True,
    ):
        self._builder = builder
        self._history_turns = history_turns
        self._list_every_turn = list_every_turn
        self.task = task
        # user turns of the whole trajectory as (observation, admissible commands)
        self._turns: list[tuple[str, list[str]]] = [(obs, list(admissible))]
        self._replies: list[str] = []  # assistant replies (decoded text) of the whole trajectory
        self._segment_first_turn = 0
        self.segment_index = 0
        self._awaiting_completion = True
        self.prompt_ids: list[int] = self._fresh_prompt()
        self.loss_mask: list[int] = [0] * len(self.prompt_ids)

    def _user(self, turn: int) -> str:
        """The text of user turn ``turn``: a segment's first turn always lists the commands."""
        obs, admissible = self._turns[turn]
        first = turn == self._segment_first_turn
        listed = admissible if first or self._list_every_turn else None
        return user_text(obs, listed, self.task if first else None)

    def _fresh_prompt(self) -> list[int]:
        first = self._segment_first_turn
        users = [self._user(i) for i in range(first, len(self._turns))]
        return self._builder.prompt(list(zip(users[:-1], self._replies[first:], strict=True)), users[-1])

    def add_completion(self, token_ids: Sequence[int], text: str) -> None:
        """Record the policy's reply to the current prompt (its ids count for the loss)."""
        if not self._awaiting_completion:
            raise RuntimeError("add_completion called twice without extend in between")
        self.prompt_ids += list(token_ids)
        self.loss_mask += [1] * len(token_ids)
        self._replies.append(text)
        self._ended_turn = bool(token_ids) and token_ids[-1] == self._builder.eot_id
        self._awaiting_completion = False

    def extend(self, obs: str, admissible: Sequence[str]) -> tuple[list[int], bool]:
        """Next turn: returns (ids appended to ``prompt_ids``, whether a new segment began).

        On a new segment the returned ids are the whole fresh ``prompt_ids``.
        """
        if self._awaiting_completion:
            raise RuntimeError("extend called before add_completion: the completion must be recorded first")
        self._turns.append((obs, list(admissible)))
        self._awaiting_completion = True
        past_in_segment = len(self._replies) - self._segment_first_turn
        if past_in_segment > self._history_turns:
            self._segment_first_turn = len(self._replies) - self._history_turns // 2
            self.segment_index += 1
            self.prompt_ids = self._fresh_prompt()
            self.loss_mask = [0] * len(self.prompt_ids)
            return list(self.prompt_ids), True
        appended = self._builder.continuation(self._user(len(self._turns) - 1), self._ended_turn)
        self.prompt_ids += appended
        self.loss_mask += [0] * len(appended)
        return appended, False


class Agent:
    """Prompt format, parsing and constrained choice for one model's tokenizer."""

    def __init__(self, cfg: AgentConfig, tokenizer: Any, game: PromptText = Alfworld.prompt) -> None:
        self.cfg = cfg
        every_turn = cfg.admissible_in_prompt == "every_turn"
        self.builder = PromptBuilder(tokenizer, cfg.action_format, every_turn, game)

    @classmethod
    def from_model(
        cls, cfg: AgentConfig, model_path: str | Path, game: PromptText = Alfworld.prompt
    ) -> Agent:
        """The agent for ``model_path``'s tokenizer, worded for ``game`` (the environment's prompt)."""
        from transformers import AutoTokenizer

        return cls(cfg, AutoTokenizer.from_pretrained(str(model_path)), game)

    def start(self, task: str, obs: str, admissible: Sequence[str]) -> Conversation:
        every_turn = self.cfg.admissible_in_prompt == "every_turn"
        return Conversation(self.builder, self.cfg.history_turns, task, obs, admissible, every_turn)

    def sampling(self, admissible: Sequence[str], base: SamplingParams) -> SamplingParams:
        """``base`` restricted to the admissible commands when constrained choice is on."""
        if self.cfg.constrain_to_admissible and admissible:
            return dataclasses.replace(base, choices=list(dict.fromkeys(admissible)))
        return base

    def parse(self, reply: str, admissible: Sequence[str]) -> ParsedAction:
        return parse_action(reply, admissible, self.cfg.action_format, self.cfg.fuzzy_threshold)
