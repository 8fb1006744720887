"""A gymnasium text environment by its registered id, unchanged (``env.name: gymnasium``).

An episode is ``gymnasium.make(env.id, **env.kwargs)`` reset with its task's seed; each reply is
``step(action)``'s action, ``str(observation)`` the next turn. A task is a seed: split ``train``
is seeds ``0 .. env.train_seeds - 1``, split ``test`` is ``env.test_seed_start`` onwards
(``env.test_seeds`` of them), so the held-out seeds never meet the train ones. When ``info``
lists the commands (``info[env.admissible_key]``, TextWorld's ``admissible_commands``), the agent
chooses among them; otherwise the reply's text is the action. ``terminated`` ends an episode,
``truncated`` (a time limit) too, without a win; the reward rule and "won" are
``envs/ecosystem.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator

from selective_rollout.envs.base import Episode, PromptText, as_task_error
from selective_rollout.envs.ecosystem import EcosystemEnvironment, EcosystemParams, Return, Shown, import_all
from selective_rollout.records import Task

SPLITS = ("train", "test")


class GymParams(EcosystemParams):
    id: str = Field(
        "",
        validate_default=True,
        description="required: the environment's registered gymnasium id (gymnasium.make(id))",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gymnasium.make")
    train_seeds: int = Field(64, ge=1, description="tasks of split train: seeds 0 .. train_seeds-1")
    test_seeds: int = Field(
        16, ge=1, description="tasks of split test: test_seeds seeds from test_seed_start"
    )
    test_seed_start: int = Field(1_000_000, ge=0, description="the first seed of split test")
    admissible_key: str = Field(
        "admissible_commands", description="the info key listing the commands, when the environment gives one"
    )
    world: str = Field("a text game", description="how the system prompt names the game")
    free_text: bool = Field(
        True,
        description="the game takes free-text replies; false when its info lists the admissible "
        "commands (env.admissible_key), so that the system prompt asks for one of them",
    )

    @field_validator("id")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value:
            raise ValueError("env.name=gymnasium needs env.id, the environment's registered id")
        return value


def _admissible(info: Any, key: str) -> list[str]:
    listed = info.get(key) if isinstance(info, dict) else None
    return [str(c) for c in listed] if listed else []


class GymEpisode:
    """One gymnasium environment, reset with its task's seed."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], seed: int, admissible_key: str) -> None:
        import gymnasium

        with as_task_error(f"make {env_id!r}"):
            self._env = gymnasium.make(env_id, **kwargs)
        self._seed, self._key = seed, admissible_key
        self._return = Return()

    def reset(self) -> Shown:
        obs, info = self._env.reset(seed=self._seed)
        return Shown(str(obs), _admissible(info, self._key))

    def step(self, command: str) -> Shown:
        obs, reward, terminated, truncated, info = self._env.step(command)
        return self._return.after(str(obs), _admissible(info, self._key), reward, terminated, truncated)

    def close(self) -> None:
        self._env.close()


@dataclass(frozen=True)
class GymSource:
    """Opens episodes of one gymnasium id in the env workers (settings only: pickled to them)."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    admissible_key: str = "admissible_commands"
    errors: tuple[type[Exception], ...] = ()

    def prepare(self) -> None:
        import_all(["gymnasium", *self.imports])

    def open(self, task: Task, n: int) -> list[Episode]:
        seed = int(task.payload["seed"])
        return [GymEpisode(self.env_id, self.kwargs, seed, self.admissible_key) for _ in range(n)]

    def task_sentence(self, first: Any) -> str:
        return first.obs.strip()

    def describe(self, task: Task) -> str:
        return f"{self.env_id} seed {task.payload.get('seed')}"


class GymText(EcosystemEnvironment):
    """A gymnasium text environment by its id (docs/environment.md, "skyrl-gym and gymnasium
    environments")."""

    Params = GymParams
    params: GymParams
    splits = SPLITS

    @property
    def prompt(self) -> PromptText:  # type: ignore[override]
        return PromptText(world=self.params.world, commands="", free_text=self.params.free_text)

    def tasks(self, split: str) -> list[Task]:
        self.check_split(split)
        p = self.params
        seeds = (
            range(p.train_seeds)
            if split == "train"
            else range(p.test_seed_start, p.test_seed_start + p.test_seeds)
        )
        return [Task(f"seed-{s}", p.id, {"seed": s}) for s in seeds]

    def cache_key(self) -> list[Any]:
        return [self.name, self.params.id, dict(self.params.kwargs)]

    def source(self) -> GymSource:
        p = self.params
        return GymSource(p.id, dict(p.kwargs), tuple(p.imports), p.admissible_key)
