"""One trajectory's dialogue, owned in one place: the text turns, the token segments, the loss mask.

The engine is prompted with, and the learner trains on, the same token ids. ``Conversation``
keeps both: each turn's prompt extends the last by the sampled completion and the next user
turn, and the very same ids, with a loss mask (1 on the policy's tokens, 0 on prompts and
observations) and the sampling log-probs, form the segments that become ``Experience``s. Nothing
copies ids from one structure into another, so the prompt the engine saw and the sequence the
learner packs cannot drift apart. The RL rollout (coordinator) and the SFT warm start (expert
walkthroughs) both build their sequences here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from selective_rollout.envs.base import Message
from selective_rollout.records import Experience
from selective_rollout.rollout.engines.trie import ChoiceTries
from selective_rollout.rollout.prompts import PromptBuilder, UserTurn, user_text


@dataclass(frozen=True)
class GeneratedTurn:
    """One engine reply to one trajectory's prompt, parsed into the command it plays.

    ``prompt_tokens`` is the whole prompt of the call (``Step.prompt_tokens``); ``logprobs[i]``
    is the engine's log-prob of ``token_ids[i]``.
    """

    command: str
    valid: bool
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_tokens: int
    versions: tuple[int, ...] = ()  # CompletionOutput.versions (empty: the engine did not say)


@dataclass
class Segment:
    """A stretch of one trajectory's dialogue that the learner packs as one sequence."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    choice_sets: dict[int, tuple[int, ...]] = field(default_factory=dict)  # as ``Experience``'s
    versions: list[int] = field(default_factory=list)  # as ``Experience.token_versions`` (-1: unknown)

    def add_prompt(self, ids: Sequence[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_completion(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float],
        choice_sets: Sequence[tuple[int, ...]] = (),
        versions: Sequence[int] = (),
    ) -> None:
        """``choice_sets[i]``: what a constrained choice allowed before ``ids[i]`` (fewer sets than
        ids: the rest was not constrained); ``versions``: the engine's per token, if it said."""
        self.choice_sets.update(enumerate(choice_sets, start=len(self.token_ids)))
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += list(versions) if len(versions) == len(ids) else [-1] * len(ids)


class Conversation:
    """One trajectory's dialogue as token ids, kept so that each prompt extends the last.

    Invariant within a segment: ``prompt_{t+1} == prompt_t + completion_t + appended_t``.
    When the history window is full, ``extend`` starts a new segment: a fresh prompt holding the
    task and the last ``history_turns // 2`` exchanges (the window slides in jumps so a segment
    lasts several turns; each segment is one learner sequence and one full prefill).

    A turn whose observation came as chat ``messages`` is rendered as those messages; when the
    first turn did (the environment's own first messages, which state the task), a later
    segment opens with them, as a text dialogue's opens with the task sentence.
    """

    def __init__(
        self,
        builder: PromptBuilder,
        history_turns: int,
        task: str,
        obs: str,
        admissible: Sequence[str],
        list_every_turn: bool = True,
        choice_tries: ChoiceTries | None = None,
        messages: Sequence[Message] | None = None,
    ):
        self._builder = builder
        self._history_turns = history_turns
        self._list_every_turn = list_every_turn
        # set when replies are decoded under constrained choice of a command: the tries it walks
        self._choice_tries = choice_tries
        self.task = task
        # user turns of the whole trajectory as (observation, admissible commands, its messages)
        self._turns: list[tuple[str, list[str], list[Message] | None]] = [
            (obs, list(admissible), None if messages is None else list(messages))
        ]
        self._replies: list[str] = []  # assistant replies (decoded text) of the whole trajectory
        self._segment_first_turn = 0
        self.segment_index = 0
        self._awaiting_completion = True
        self.segments: list[Segment] = [Segment()]
        self.segments[-1].add_prompt(self._fresh_prompt())

    @property
    def prompt_ids(self) -> list[int]:
        """The current segment's ids: the next engine call's prompt (after ``extend``)."""
        return self.segments[-1].token_ids

    @property
    def loss_mask(self) -> list[int]:
        """The current segment's loss mask, aligned with ``prompt_ids``."""
        return self.segments[-1].loss_mask

    def _user(self, turn: int) -> UserTurn:
        """User turn ``turn``: its messages as given, or its text (a segment's first turn always
        lists the commands); a later segment's first turn is led by the first turn's messages."""
        obs, admissible, messages = self._turns[turn]
        first = turn == self._segment_first_turn
        opening = self._turns[0][2] if first and turn > 0 else None
        if messages is not None:
            return [*(opening or []), *messages]
        listed = admissible if first or self._list_every_turn else None
        if opening is not None:
            return [*opening, {"role": "user", "content": user_text(obs, listed)}]
        return user_text(obs, listed, self.task if first else None)

    def _fresh_prompt(self) -> list[int]:
        first = self._segment_first_turn
        users = [self._user(i) for i in range(first, len(self._turns))]
        return self._builder.prompt(list(zip(users[:-1], self._replies[first:], strict=True)), users[-1])

    def add_completion(
        self,
        token_ids: Sequence[int],
        text: str,
        logprobs: Sequence[float] | None = None,
        versions: Sequence[int] = (),
    ) -> None:
        """Record the policy's reply to the current prompt: its ids count for the loss, with the
        engine's ``logprobs`` (an expert's reply, cloned in the warm start, has none: 0.0) and
        ``versions`` (``CompletionOutput.versions``, where the engine gave them) and, when
        decoding is constrained to the admissible commands, the ids the choice allowed at each
        token (the trie the engines walk, rebuilt here), so the learner can train the policy that
        acted rather than the unconstrained model."""
        if not self._awaiting_completion:
            raise RuntimeError("add_completion called twice without extend in between")
        admissible = self._turns[-1][1]
        choice_sets = (
            self._choice_tries(admissible).allowed_along(token_ids)
            if self._choice_tries is not None and admissible
            else []
        )
        self.segments[-1].add_completion(
            token_ids, [0.0] * len(token_ids) if logprobs is None else logprobs, choice_sets, versions
        )
        self._replies.append(text)
        self._ended_turn = bool(token_ids) and token_ids[-1] == self._builder.eot_id
        self._awaiting_completion = False

    def extend(
        self, obs: str, admissible: Sequence[str], messages: Sequence[Message] | None = None
    ) -> tuple[list[int], bool]:
        """Next turn (its observation as text, or as the environment's chat ``messages``):
        returns (ids appended to ``prompt_ids``, whether a new segment began).

        On a new segment the returned ids are the whole fresh ``prompt_ids``.
        """
        if self._awaiting_completion:
            raise RuntimeError("extend called before add_completion: the completion must be recorded first")
        self._turns.append((obs, list(admissible), None if messages is None else list(messages)))
        self._awaiting_completion = True
        past_in_segment = len(self._replies) - self._segment_first_turn
        if past_in_segment > self._history_turns:
            self._segment_first_turn = len(self._replies) - self._history_turns // 2
            self.segment_index += 1
            self.segments.append(Segment())
            self.segments[-1].add_prompt(self._fresh_prompt())
            return list(self.prompt_ids), True
        appended = self._builder.continuation(self._user(len(self._turns) - 1), self._ended_turn)
        self.segments[-1].add_prompt(appended)
        return appended, False

    def experiences(
        self, group_id: str, task_id: str, task_type: str, reward: float, trajectory: int = 0
    ) -> list[Experience]:
        """One Experience per segment that holds policy tokens, all rewarded with ``reward``."""
        return [
            Experience(
                group_id=group_id,
                task_id=task_id,
                task_type=task_type,
                token_ids=list(seg.token_ids),
                loss_mask=list(seg.loss_mask),
                old_logprobs=list(seg.logprobs),
                reward=reward,
                trajectory=trajectory,
                choice_sets=dict(seg.choice_sets),
                token_versions=list(seg.versions) if any(v >= 0 for v in seg.versions) else [],
            )
            for seg in self.segments
            if any(seg.loss_mask)
        ]
