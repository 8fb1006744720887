"""A capability of the environments whose tasks are game folders (ALFWorld, TextWorld Cooking):
a games root, a generated set of a given size and seed, and generation only where it is safe.

An environment with it subclasses ``GameFolders`` before ``Environment`` and its ``Params`` extend
``GameFolderParams``, so ``env.games_dir``, ``env.n_train`` and the rest are its own keys of the
``env`` section: an environment without game folders (skyrl-gym rows, a gymnasium id) refuses
them by name instead of ignoring them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from selective_rollout.envs.base import EnvParams


class GameFolderParams(EnvParams):
    """The keys of an environment whose tasks are game folders."""

    games_dir: str | None = Field(
        None,
        description="games root; unset: the environment's own folder (data/games/<preset> for alfworld, "
        "data/games/tw-cooking-<level> for tw-cooking), where missing games are generated; elsewhere "
        "only with env.generate",
    )
    generate: bool = Field(
        False, description="generate missing games into a games_dir other than the environment's own folder"
    )
    games_seed: int = Field(0, description="seed of the generated game set (kept apart from the run seed)")
    n_train: int = Field(60, ge=1, description="generated train games")
    n_valid: int = Field(24, ge=1, description="generated games in each of valid_seen and valid_unseen")


class GameFolders:
    """Mixin of an ``Environment`` whose ``params`` are ``GameFolderParams``."""

    params: GameFolderParams

    def default_games_dir(self) -> str:
        """Where this environment's games live when ``env.games_dir`` is not set (generated there
        on first use)."""
        raise NotImplementedError

    @property
    def games_dir(self) -> Path:
        return Path(self.params.games_dir or self.default_games_dir())

    def may_generate(self) -> bool:
        """Missing games are made only in the default folder or on request, so that a mistyped
        ``env.games_dir`` never trains on a fresh set."""
        return self.params.generate or self.games_dir == Path(self.default_games_dir())

    def cache_key(self) -> list[Any]:
        """What identifies the game set, for caches built from it (the warm start)."""
        return [str(self.games_dir.resolve())]
