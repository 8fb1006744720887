"""The environment seam: what the trainer needs from an environment, and the registry of them.

An environment is one module plus ``@register_env("name")``: it supplies its task source (train
and evaluation splits, generating missing games), its episode pool (Ray actors), its prompt
wording, its reward rule and what the warm start needs (walkthroughs and an in-process episode to
replay them). The run config selects one with ``env.name``; the entry's own parameters are flat
keys of the ``env`` section, declared by its ``Params`` model (as gates declare theirs), so the
trainer never branches on which environment it runs.

Everything here is light: registering an environment imports none of its engine, which is loaded
where episodes are played (env workers, the warm start).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

from selective_rollout.records import Task
from selective_rollout.registry import registrar

if TYPE_CHECKING:
    from selective_rollout.config.env import EnvConfig


class EpisodeState(Protocol):
    """One episode after a reset or a step, as the pool reports it."""

    episode_id: str
    obs: str
    admissible: list[str]
    reward: float  # the engine's reward for this step
    done: bool  # the episode ended (won or lost)
    won: bool
    task: str  # the task sentence (first observation only)
    failed: str | None  # why the episode was lost (its worker died, the engine failed), else None


class EnvPool(Protocol):
    """Episodes served by Ray actors. A group is G episodes of one game, opened together."""

    async def reset_group(self, game_dir: str, g: int) -> list[EpisodeState]:
        """G fresh episodes of one game; raises one of the environment's ``game_errors`` when the
        game cannot be played."""
        ...

    async def step(self, actions: dict[str, str]) -> dict[str, EpisodeState]:
        """Step many episodes (of any groups) at once: episode id -> command."""
        ...

    async def close(self, episode_ids: Iterable[str]) -> None: ...

    async def metrics(self) -> dict[str, float]: ...

    async def worker_locations(self) -> list[dict[str, object]]: ...

    async def worker_pids(self) -> list[int]: ...

    def shutdown(self) -> None: ...


class Observation(Protocol):
    """What an in-process episode shows after a reset or a step."""

    obs: str
    admissible: list[str]
    won: bool

    @property
    def done(self) -> bool: ...


class Episode(Protocol):
    """One episode played in this process (the warm start replays walkthroughs in it)."""

    def reset(self) -> Observation: ...

    def step(self, command: str) -> Observation: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PromptText:
    """How the system prompt names the game: ``world`` ("a household text game") and, for the
    prompt that does not list the admissible commands, the verbs the game understands."""

    world: str
    commands: str


class EnvParams(BaseModel):
    """Base of an environment's own parameters (flat keys of the ``env`` section)."""

    model_config = ConfigDict(extra="forbid")


class Environment:
    """Interface; one instance per process that needs it, built from the run's ``env`` section.

    ``Params`` declares the environment's own parameters; ``self.params`` holds their values and
    ``self.cfg`` the shared keys (games_dir, generate, games_seed, n_train, n_valid, num_workers).
    """

    name: ClassVar[str] = "environment"
    Params: ClassVar[type[EnvParams]] = EnvParams
    prompt: ClassVar[PromptText]
    splits: ClassVar[tuple[str, ...]] = ("train", "valid_seen", "valid_unseen")

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.params = self.Params.model_validate(cfg.model_extra or {})

    @classmethod
    def own_params(cls) -> dict[str, FieldInfo]:
        return dict(cls.Params.model_fields)

    # ---------------------------------------------------------------- tasks
    def default_games_dir(self) -> str:
        """Where this environment's games live when ``env.games_dir`` is not set (generated there
        on first use)."""
        raise NotImplementedError

    @property
    def games_dir(self) -> Path:
        return Path(self.cfg.games_dir or self.default_games_dir())

    def tasks(self, split: str) -> list[Task]:
        """Every task of ``split`` the config names, in a fixed order (generated when missing
        into the default games folder, or anywhere with ``env.generate``)."""
        raise NotImplementedError

    def may_generate(self) -> bool:
        """Missing games are made only in the default folder or on request, so that a mistyped
        ``env.games_dir`` never trains on a fresh set."""
        return self.cfg.generate or self.games_dir == Path(self.default_games_dir())

    def cache_key(self) -> list[Any]:
        """What identifies the game set, for caches built from it (the warm start)."""
        return [str(self.games_dir.resolve())]

    # ---------------------------------------------------------------- episodes
    def pool(self, worker_options: dict[str, Any] | None = None) -> EnvPool:
        """The Ray actors that play this environment's episodes (Ray must be initialised)."""
        raise NotImplementedError

    def game_errors(self) -> tuple[type[Exception], ...]:
        """What the pool's ``reset_group`` raises for a game that cannot be played: such a task
        is never retried and is skipped for the rest of the run."""
        from alfworld_env.errors import GameError  # the shared pool's error (alfworld_env.pool)

        return (GameError,)

    def reward(self, final: EpisodeState) -> float:
        """A finished or truncated trajectory's reward from its last state: 1 for a win."""
        return float(final.won)

    # ---------------------------------------------------------------- warm start
    def episode(self, game_dir: str) -> Episode:
        """One episode of the game, in this process."""
        raise NotImplementedError

    def walkthrough(self, game_dir: str) -> list[str]:
        """The generator's winning commands for the game (what the warm start clones)."""
        raise NotImplementedError

    def task_of(self, first: Observation) -> str:
        """The task sentence of an in-process episode's first observation."""
        raise NotImplementedError


ENVS: dict[str, type[Environment]] = {}


# class decorator: make the environment selectable as ``env.name: <name>``
register_env = registrar(ENVS, "environment", EnvParams)


def env_class(name: str) -> type[Environment]:
    """The environment registered under ``name``, with a clear error naming the known ones."""
    try:
        return ENVS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(sorted(ENVS))}") from None
