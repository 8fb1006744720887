"""Prompts through the model's own chat template, built token by token across turns.

The learner trains on a trajectory as one token sequence, so the next turn's prompt must be
the previous prompt plus the sampled completion plus a suffix, exactly, in token ids: never a
re-tokenisation of the dialogue, which can split the model's own tokens differently. The
suffix (end-of-turn, next user turn, assistant header) is cut from the template's rendering
of a dialogue around a sentinel reply, so any chat template that renders the assistant's
content verbatim works, not only ChatML.

A user turn is either text (one user message: the project's wording of an observation) or the
chat messages an environment gave (rendered as given, whatever their roles); an environment's
own system prompt replaces the project's (``PromptBuilder.with_system``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

from selective_rollout.envs.base import Message, PromptText

ActionFormat = Literal["react", "action"]
UserTurn = str | Sequence[Message]  # text: one user message; messages: as the environment gave them

# how the reply is asked for, per action format; the game's name comes from the environment
_REPLY_FORMATS: dict[str, str] = {
    "action": "Reply with exactly one admissible action, copied verbatim, and nothing else.",
    "react": (
        "Reply in exactly this form:\n"
        "Thought: <one short sentence of reasoning>\n"
        "Action: <one admissible action, copied verbatim>"
    ),
}
# the same for a game that takes free text (``PromptText.free_text``)
_FREE_REPLY_FORMATS: dict[str, str] = {
    "action": "Reply with your next action and nothing else.",
    "react": (
        "Reply in exactly this form:\nThought: <one short sentence of reasoning>\nAction: <your next action>"
    ),
}


def system_prompt(action_format: ActionFormat, game: PromptText, lists_every_turn: bool = True) -> str:
    """The system prompt for ``game`` (the environment's wording, ``Environment.prompt``).

    With the action format and the admissible list not re-sent every turn
    (agent.admissible_in_prompt), decoding is constrained to the admissible commands, so the
    prompt names the game's verbs as a hint, not a contract.
    """
    if action_format not in _REPLY_FORMATS:
        raise ValueError(f"action_format must be one of {sorted(_REPLY_FORMATS)}, got {action_format!r}")
    if game.free_text:
        verbs = f" ({game.commands})" if game.commands else ""
        return (
            f"You are an agent in {game.world}{verbs}. Each turn you see what happened. "
            f"{_FREE_REPLY_FORMATS[action_format]}"
        )
    if action_format == "action" and not lists_every_turn:
        return (
            f"You are an agent in {game.world}. Each turn you see what happened. Reply with exactly one "
            f"command of the game ({game.commands}) and nothing else."
        )
    return (
        f"You are an agent in {game.world}. Each turn you see what happened and the list of "
        f"admissible actions. {_REPLY_FORMATS[action_format]}"
    )


_SENTINEL = "\u2063SR-SENTINEL\u2063"


def user_text(obs: str, admissible: Sequence[str] | None, task: str | None = None) -> str:
    """One user turn: the task (first turn of a prompt only), the observation, the choices
    (``None``: not listed, as when decoding is constrained to them anyway; none at all: a
    free-text game, which has no list to show)."""
    head = f"Task: {task.strip()}\n\n" if task else ""
    if admissible is None or not admissible:
        return f"{head}Observation: {obs.strip()}"
    actions = "\n".join(f"- {a}" for a in admissible)
    return f"{head}Observation: {obs.strip()}\n\nAdmissible actions:\n{actions}"


def as_messages(turn: UserTurn) -> list[Message]:
    """A user turn as chat messages."""
    return [{"role": "user", "content": turn}] if isinstance(turn, str) else [dict(m) for m in turn]


class PromptBuilder:
    """Renders and tokenises dialogue pieces with one tokenizer's chat template, for one game's
    wording (the environment's ``prompt``); ``system`` is None where the environment's first
    messages carry no system prompt (the template's own default, if any, applies)."""

    def __init__(
        self,
        tokenizer: Any,
        action_format: ActionFormat,
        game: PromptText,
        lists_every_turn: bool = True,
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template")
        self.system: str | None = system_prompt(action_format, game, lists_every_turn)
        self.tokenizer = tokenizer
        self.eot_id: int = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def with_system(self, system: str | None) -> PromptBuilder:
        """The same builder with the environment's own system prompt (or none)."""
        other = copy.copy(self)
        other.system = system
        return other

    def _head(self) -> list[Message]:
        return [] if self.system is None else [{"role": "system", "content": self.system}]

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )

    def prompt(self, exchanges: Sequence[tuple[UserTurn, str]], last_user: UserTurn) -> list[int]:
        """A whole prompt: system, past (user, assistant) exchanges, the new user turn, header."""
        messages = self._head()
        for user, assistant in exchanges:
            messages += [*as_messages(user), {"role": "assistant", "content": assistant}]
        messages += as_messages(last_user)
        return self._ids(self._render(messages, generation_prompt=True))

    def continuation(self, last_user: UserTurn, completion_ended_turn: bool) -> list[int]:
        """Ids that follow a completion: end-of-turn (unless sampled), the user turn, the header."""
        messages = [
            *self._head(),
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _SENTINEL},
            *as_messages(last_user),
        ]
        rendered = self._render(messages, generation_prompt=True)
        _, sep, after = rendered.partition(_SENTINEL)
        if not sep:
            raise ValueError("the chat template does not render assistant content verbatim")
        ids = self._ids(after)
        if completion_ended_turn and ids and ids[0] == self.eot_id:
            ids = ids[1:]
        return ids
