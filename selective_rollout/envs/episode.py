"""One episode of an environment's task: the contract every process that plays one relies on (the
env pool's workers, the warm start, the play CLI), and the error a task that cannot be played
raises. Light: pydantic-free, no engine and no Ray."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from selective_rollout.records import Task


class TaskError(ValueError):
    """A task its environment cannot play (a corrupt or hand-edited game file, a malformed record).

    It carries text only: an engine's own exceptions may not survive a trip to another process
    (some import modules that exit the process on unpickling), so a failure leaves an episode as
    this. Every consumer (the rollout, the evaluation, the warm start, the play CLI) names such a
    task in one line and skips it."""


@contextmanager
def as_task_error(what: str, worded: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Turn whatever an engine raises while it does ``what`` into a ``TaskError``; an error of a
    ``worded`` type already says what failed and keeps its text."""
    try:
        yield
    except TaskError:
        raise
    except worded as exc:
        raise TaskError(str(exc)) from None
    except Exception as exc:  # engines raise parser, planner and KeyError types alike
        raise TaskError(f"the engine failed to {what}: {type(exc).__name__}: {exc}") from None


Message = dict[str, str]  # one chat message: {"role": ..., "content": ...}


class Observation(Protocol):
    """What an episode shows the player after a reset or a step.

    ``admissible`` lists the commands the game accepts; an empty list makes the game free-text
    (the reply's action text is sent as is). Two attributes are optional, read with
    ``step_reward`` and ``messages_of``: ``reward`` (this step's reward; without it, 1.0 on the
    winning step) and ``messages`` (the observation as chat messages, rendered as given: on the
    first observation, the environment's own first messages, its system prompt included)."""

    obs: str
    admissible: list[str]
    won: bool

    @property
    def done(self) -> bool: ...


def step_reward(ob: Observation) -> float:
    """The step's reward: the observation's own, or 1.0 on the winning step."""
    reward = getattr(ob, "reward", None)
    return float(ob.won) if reward is None else float(reward)


def messages_of(ob: Any) -> list[Message] | None:
    """The observation's chat messages, or None for a text observation."""
    messages = getattr(ob, "messages", None)
    return None if messages is None else [dict(m) for m in messages]


class Episode(Protocol):
    """One episode of a task, played in the process that holds it (an env worker, or the warm
    start replaying a walkthrough)."""

    def reset(self) -> Observation: ...

    def step(self, command: str) -> Observation: ...

    def close(self) -> None: ...


class EpisodeSource(Protocol):
    """How a process opens episodes of an environment's tasks. It is pickled to the env workers,
    so it holds settings only; ``prepare`` runs once in a process before its first episode.
    ``errors`` are the engine's own error types whose text already names the failure."""

    errors: tuple[type[Exception], ...]

    def prepare(self) -> None: ...

    def open(self, task: Task, n: int) -> list[Episode]:
        """``n`` independent episodes of ``task`` (what they share is read once for all); raises
        ``TaskError``, ``OSError`` or ``ValueError`` when the task cannot be played."""
        ...

    def task_sentence(self, first: Observation) -> str:
        """The task sentence of an episode's first observation (what the prompt and the logs
        call the task)."""
        ...

    def describe(self, task: Task) -> str:
        """What a failure to play ``task`` names (its file, say)."""
        ...


@dataclass
class EpisodeState:
    """One episode after a reset or a step, as the pool reports it."""

    episode_id: str
    obs: str
    admissible: list[str]
    reward: float = 0.0  # the engine's reward for this step
    done: bool = False  # the episode ended (won or lost)
    won: bool = False
    task: str = ""  # the task sentence (first observation only)
    failed: str | None = None  # why the episode was lost (its worker died, the engine failed)
    messages: list[Message] | None = None  # the observation as chat messages (``Observation``)
