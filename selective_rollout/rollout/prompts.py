"""Prompts through the model's own chat template, built token by token across turns.

The learner trains on a trajectory as one token sequence, so the next turn's prompt must be
the previous prompt plus the sampled completion plus a suffix, exactly, in token ids: never a
re-tokenisation of the dialogue, which can split the model's own tokens differently. The
suffix (end-of-turn, next user turn, assistant header) is cut from the template's rendering
of a dialogue around a sentinel reply, so any chat template that renders the assistant's
content verbatim works, not only ChatML.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from selective_rollout.envs.base import PromptText

ActionFormat = Literal["react", "action"]

# how the reply is asked for, per action format; the game's name comes from the environment
_REPLY_FORMATS: dict[str, str] = {
    "action": "Reply with exactly one admissible action, copied verbatim, and nothing else.",
    "react": (
        "Reply in exactly this form:\n"
        "Thought: <one short sentence of reasoning>\n"
        "Action: <one admissible action, copied verbatim>"
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
    (``None``: not listed, as when decoding is constrained to them anyway)."""
    head = f"Task: {task.strip()}\n\n" if task else ""
    if admissible is None:
        return f"{head}Observation: {obs.strip()}"
    actions = "\n".join(f"- {a}" for a in admissible)
    return f"{head}Observation: {obs.strip()}\n\nAdmissible actions:\n{actions}"


class PromptBuilder:
    """Renders and tokenises dialogue pieces with one tokenizer's chat template, for one game's
    wording (the environment's ``prompt``)."""

    def __init__(
        self,
        tokenizer: Any,
        action_format: ActionFormat,
        game: PromptText,
        lists_every_turn: bool = True,
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template")
        self.system = system_prompt(action_format, game, lists_every_turn)
        self.tokenizer = tokenizer
        self.eot_id: int = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )

    def prompt(self, exchanges: Sequence[tuple[str, str]], last_user: str) -> list[int]:
        """A whole prompt: system, past (user, assistant) exchanges, the new user turn, header."""
        messages = [{"role": "system", "content": self.system}]
        for user, assistant in exchanges:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        messages.append({"role": "user", "content": last_user})
        return self._ids(self._render(messages, generation_prompt=True))

    def continuation(self, last_user: str, completion_ended_turn: bool) -> list[int]:
        """Ids that follow a completion: end-of-turn (unless sampled), the user turn, the header."""
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": last_user},
        ]
        rendered = self._render(messages, generation_prompt=True)
        _, sep, after = rendered.partition(_SENTINEL)
        if not sep:
            raise ValueError("the chat template does not render assistant content verbatim")
        ids = self._ids(after)
        if completion_ended_turn and ids and ids[0] == self.eot_id:
            ids = ids[1:]
        return ids
