"""skyrl-gym environments, unchanged (``env.name: skyrl_gym``): rows in SkyRL's dataset format,
one environment instance per episode, made from its row as SkyRL makes it.

A row (a JSONL line, or a parquet row) holds ``prompt`` (chat messages), ``env_class`` (a
registered skyrl-gym id), and what the environment reads from its extras (``reward_spec``,
``extra_info``, ...). Splits come from ``env.data_files``: a mapping of split to files, or a list
of files whose rows name their split in ``extra_info.split`` (``train`` when absent). An episode
is ``skyrl_gym.make(env_class, env_config=..., extras=row)`` (the row less its ``prompt`` and
``env_class``), ``init(prompt)``, whose messages open the dialogue, then ``step(reply)`` per turn
until it says ``done``; its reward rule and "won" are ``envs/ecosystem.py``'s.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from selective_rollout.envs.base import Episode, Message, as_task_error
from selective_rollout.envs.ecosystem import (
    EcosystemEnvironment,
    EcosystemParams,
    Return,
    Shown,
    import_all,
    text_of,
)
from selective_rollout.records import Task

_NOT_EXTRAS = ("prompt", "env_class")


class SkyrlParams(EcosystemParams):
    data_files: dict[str, list[str]] | list[str] = Field(
        default_factory=list,
        validate_default=True,
        description="required: rows in SkyRL's format (.jsonl or .parquet): {split: [files]}, or [files] "
        "whose rows name their split in extra_info.split (train when absent)",
    )
    env_config: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per env_class, the env_config its environments are made with (SkyRL's "
        "environment.skyrl_gym.<env_class> section)",
    )

    @field_validator("data_files")
    @classmethod
    def _given(cls, value: dict[str, list[str]] | list[str]) -> dict[str, list[str]] | list[str]:
        if not value:
            raise ValueError("env.name=skyrl_gym needs env.data_files, the rows to play")
        return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one data file (JSONL, or parquet through pandas)."""
    if not path.is_file():
        raise FileNotFoundError(f"env.data_files: no such file: {path}")
    if path.suffix == ".parquet":
        import pandas as pd

        return [_plain(row) for row in pd.read_parquet(path).to_dict("records")]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _plain(value: Any) -> Any:
    """A parquet value as JSON-like data (lists come back as numpy arrays)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, str):
        return _plain(value.tolist())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _checked(row: Any, where: str) -> None:
    """One line naming the row when it lacks what every episode is made from."""
    ok = (
        isinstance(row, dict)
        and isinstance(row.get("prompt"), list)
        and isinstance(row.get("env_class"), str)
    )
    if not ok:
        raise ValueError(f"{where}: a row needs 'prompt' (chat messages) and 'env_class' (a skyrl-gym id)")


class SkyrlEpisode:
    """One skyrl-gym environment instance, made from its row."""

    def __init__(self, row: dict[str, Any], env_config: dict[str, Any]) -> None:
        import skyrl_gym
        from omegaconf import OmegaConf

        extras = {k: v for k, v in row.items() if k not in _NOT_EXTRAS}
        with as_task_error(f"make {row['env_class']!r}"):
            self._env = skyrl_gym.make(
                row["env_class"], env_config=OmegaConf.create(env_config), extras=extras
            )
        self._prompt: list[Message] = row["prompt"]
        self._return = Return()

    def reset(self) -> Shown:
        messages, _ = self._env.init(copy.deepcopy(self._prompt))
        return Shown(text_of(messages), [], messages=list(messages))

    def step(self, command: str) -> Shown:
        out = self._env.step(command)
        observations = list(out.get("observations") or [])
        return self._return.after(
            text_of(observations), [], out.get("reward") or 0.0, out["done"], messages=observations
        )

    def close(self) -> None:
        self._env.close()


@dataclass(frozen=True)
class SkyrlSource:
    """Opens skyrl-gym episodes of rows in the env workers (settings only: pickled to them)."""

    imports: tuple[str, ...] = ()
    env_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: tuple[type[Exception], ...] = ()

    def prepare(self) -> None:
        import_all(["skyrl_gym", *self.imports])

    def open(self, task: Task, n: int) -> list[Episode]:
        row = dict(task.payload)
        config = self.env_config.get(row.get("env_class", ""), {})
        return [SkyrlEpisode(row, config) for _ in range(n)]

    def task_sentence(self, first: Any) -> str:
        """The last user message of the opening messages."""
        users = [m for m in first.messages or [] if m.get("role") == "user"]
        return str(users[-1]["content"]).strip() if users else first.obs

    def describe(self, task: Task) -> str:
        return f"row {task.task_id} (env_class {task.task_type})"


class SkyrlGym(EcosystemEnvironment):
    """skyrl-gym environments on rows of data files (docs/environment.md, "skyrl-gym and
    gymnasium environments")."""

    Params = SkyrlParams
    params: SkyrlParams

    @cached_property
    def _rows(self) -> dict[str, list[dict[str, Any]]]:
        """The rows of each split, in file order: a file's split is its key in ``env.data_files``,
        or (a list of files) each row's ``extra_info.split``."""
        files = self.params.data_files
        named = (
            [(split, path) for split, paths in files.items() for path in paths]
            if isinstance(files, dict)
            else [(None, path) for path in files]
        )
        by_split: dict[str, list[dict[str, Any]]] = {}
        for split, path in named:
            for i, row in enumerate(read_rows(Path(path))):
                _checked(row, f"{path} row {i}")
                name = split or str((row.get("extra_info") or {}).get("split") or "train")
                by_split.setdefault(name, []).append(row)
        return by_split

    @property
    def splits(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self._rows)

    def tasks(self, split: str) -> list[Task]:
        self.check_split(split)
        return [Task(f"{split}-{i}", row["env_class"], row) for i, row in enumerate(self._rows[split])]

    def cache_key(self) -> list[Any]:
        return [self.name, json.dumps(self.params.data_files, sort_keys=True)]

    def source(self) -> SkyrlSource:
        return SkyrlSource(tuple(self.params.imports), dict(self.params.env_config))
