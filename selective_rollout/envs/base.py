"""The environment seam: what the trainer needs from an environment, and the registry of them.

An environment is one module plus one line in ``selective_rollout/plugins.py`` (or an entry point
of the group "selective_rollout.envs" in a package of yours): it lists its tasks by split, opens
episodes of a task (``source()``: reset, step, close, a reward per step), served by the Ray pool,
and states its trajectory-reward rule and what "won" means. Folders of games, generating them,
walkthroughs and the warm start's in-process episode are capabilities of the environments that
have them (ALFWorld, TextWorld Cooking). Environments written for skyrl-gym or gymnasium run
through the adapters ``envs/skyrl.py`` and ``envs/gym_text.py``. The run config selects one with
``env.name``; the entry's own parameters are flat keys of the ``env`` section, declared by its
``Params`` model (as gates declare theirs), so the trainer never branches on which environment it
runs.

Everything here is light: registering an environment imports none of its engine, which is loaded
where episodes are played (env workers, the warm start).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from selective_rollout.envs.episode import (
    Episode,
    EpisodeSource,
    EpisodeState,
    Message,
    Observation,
    TaskError,
    as_task_error,
    messages_of,
    step_reward,
)
from selective_rollout.records import Task
from selective_rollout.registry import Registry

# every environment by name (lines of selective_rollout.plugins, entry points of the group
# "selective_rollout.envs", or a class named by its path)
ENVS: Registry = Registry(
    "environment",
    "selective_rollout.envs",
    base=f"{__name__}:Environment",
    params_base=f"{__name__}:EnvParams",
    catalog="selective_rollout.plugins:ENV_CATALOG",
)

__all__ = [
    "ENVS",
    "EnvParams",
    "EnvPool",
    "Environment",
    "Episode",
    "EpisodeSource",
    "EpisodeState",
    "Message",
    "Observation",
    "PromptText",
    "TaskError",
    "as_task_error",
    "folder_task",
    "game_dir",
    "messages_of",
    "step_reward",
]


def folder_task(game_dir: str, task_id: str, task_type: str) -> Task:
    """The task of a game that lives in a folder (ALFWorld's, TextWorld Cooking's)."""
    return Task(task_id, task_type, {"game_dir": game_dir})


def game_dir(task: Task) -> Path:
    """The folder of a folder-kind task; a task without one cannot be played."""
    folder = task.payload.get("game_dir")
    if not folder:
        raise TaskError(f"{task.task_id}: the task names no game folder")
    return Path(folder)


class EnvPool(Protocol):
    """Episodes served by Ray actors (``envs.pool.RayEnvPool``, or a test's double). A group is G
    episodes of one task, opened together."""

    async def reset_group(self, task: Task, g: int) -> list[EpisodeState]:
        """G fresh episodes of one task; raises ``TaskError`` when the task cannot be played."""
        ...

    async def step(self, actions: dict[str, str]) -> dict[str, EpisodeState]:
        """Step many episodes (of any groups) at once: episode id -> command."""
        ...

    async def close(self, episode_ids: Iterable[str]) -> None: ...

    async def metrics(self) -> dict[str, float]: ...

    async def worker_locations(self) -> list[dict[str, object]]: ...

    async def worker_pids(self) -> list[int]: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class PromptText:
    """How the system prompt names the game: ``world`` ("a household text game") and, for the
    prompt that does not list the admissible commands, the verbs the game understands;
    ``free_text``: the game takes free-text replies (no admissible list), so the prompt asks for
    an action, not a copy of a listed one. An environment that gives its own first messages
    (system prompt included) is played with those instead."""

    world: str
    commands: str
    free_text: bool = False


class EnvParams(BaseModel):
    """What every environment is built with: the shared keys of the ``env`` section, declared here
    once (the section borrows them). An environment's own parameters extend this model
    (``class Params(EnvParams)``) and become flat keys of the section too."""

    model_config = ConfigDict(extra="forbid")

    num_workers: int = Field(2, ge=1, description="env worker actors; each hosts many episodes")
    stop: list[str] = Field(
        default_factory=list,
        description="stop strings: a free-text reply ends with the token that completes the first of "
        "them (kept in the reply), as the environment's answer format wants (</answer>, say)",
    )


class Environment:
    """Interface; one instance per process that needs it, built from the run's ``env`` section.

    ``Params`` declares the environment's parameters (the shared keys of ``EnvParams`` and its
    own); ``self.params`` holds their values (``ENVS.build(name, section)``). ``splits`` are the
    environment's own split names (``eval.split`` names one of them).
    """

    name: ClassVar[str] = "environment"
    Params: ClassVar[type[EnvParams]] = EnvParams
    prompt: ClassVar[PromptText]
    splits: ClassVar[tuple[str, ...]] = ("train", "valid_seen", "valid_unseen")

    def __init__(self, params: EnvParams | None = None) -> None:
        self.params = params if params is not None else self.Params()

    # ---------------------------------------------------------------- tasks
    def tasks(self, split: str) -> list[Task]:
        """Every task of ``split`` the config names, in a fixed order; a split that is not one of
        ``splits`` is a ``ValueError`` (``check_split``)."""
        raise NotImplementedError

    def check_split(self, split: str) -> None:
        """One line naming the environment's splits when ``split`` is not one of them (a
        mistyped ``eval.split`` stops the run before anything is played)."""
        if split not in self.splits:
            raise ValueError(
                f"split {split!r}: environment {self.name!r} has the splits {', '.join(self.splits)} "
                "(eval.split names one of them)"
            )

    def cache_key(self) -> list[Any]:
        """What identifies the task set, for caches built from it (the warm start)."""
        return [self.name, self.params.model_dump(mode="json", exclude={"num_workers"})]

    # ---------------------------------------------------------------- episodes
    def source(self) -> EpisodeSource:
        """How a process opens this environment's episodes (pickled to the env workers)."""
        raise NotImplementedError

    def pool(self, worker_options: dict[str, Any] | None = None) -> EnvPool:
        """The Ray actors that play this environment's episodes (Ray must be initialised)."""
        from selective_rollout.envs.pool import RayEnvPool  # imports Ray

        return RayEnvPool(self.params.num_workers, self.source(), worker_options)

    def game_errors(self) -> tuple[type[Exception], ...]:
        """What the pool's ``reset_group`` raises for a task that cannot be played: such a task
        is never retried and is skipped for the rest of the run."""
        return (TaskError,)

    def reward(self, final: EpisodeState) -> float:
        """A finished or truncated trajectory's reward from its last state: 1 for a win."""
        return float(final.won)

    def trajectory_reward(self, step_rewards: Sequence[float], final: EpisodeState) -> float:
        """A finished or truncated trajectory's reward from its steps' rewards and its last
        state: ``reward(final)`` unless the environment states another rule (the ecosystem
        adapters sum the steps' rewards, as SkyRL does)."""
        return self.reward(final)

    def stop_strings(self) -> list[str]:
        """The stop strings every reply is sampled with (``env.stop``)."""
        return list(self.params.stop)

    # ---------------------------------------------------------------- warm start
    def episode(self, task: Task) -> Episode:
        """One episode of ``task``, in this process."""
        source = self.source()
        source.prepare()
        with as_task_error(f"open {source.describe(task)}", source.errors):
            (episode,) = source.open(task, 1)
        return episode

    def walkthrough(self, task: Task) -> list[str]:
        """Winning commands for ``task`` (what the warm start clones); raises ``TaskError`` when
        the task has none, as every task of an environment without walkthroughs."""
        raise TaskError(f"{task.task_id}: environment {self.name!r} has no walkthroughs to clone")

    def task_of(self, first: Observation) -> str:
        """The task sentence of an episode's first observation."""
        return self.source().task_sentence(first)
