"""TextWorld Cooking (``env.name: tw-cooking``): the cooking games of the First TextWorld Problems
benchmark, generated offline by textworld's ``tw-cooking`` challenge and played by the real
TextWorld engine in the env pool's Ray workers (``CookingSource``; docs/environment.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from selective_rollout.envs import base as seam
from selective_rollout.envs.base import Environment, PromptText
from selective_rollout.envs.game_folders import GameFolderParams, GameFolders
from selective_rollout.records import Task

log = logging.getLogger(__name__)


class CookingParams(GameFolderParams):
    level: str = Field(
        "medium",
        description="difficulty of generated tw-cooking games: easy (1 ingredient, 1 room), medium "
        "(2 ingredients, 6 rooms, cook), hard (3 ingredients, 9 rooms); all need opening and cutting",
    )

    @field_validator("level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        from selective_rollout.envs.tw_cooking.games import level_of

        level_of(value)  # raises ValueError naming the levels
        return value


class TwCooking(GameFolders, Environment):
    """TextWorld Cooking: read the cookbook, gather, cut and cook the ingredients, prepare and eat
    the meal (real TextWorld engine, games generated offline by tw-make's generator)."""

    Params = CookingParams
    params: CookingParams
    prompt = PromptText(
        world="a text adventure about cooking a meal",
        commands="go north/south/east/west, open, close, take, drop, examine, read, cook ... with, "
        "slice/dice/chop ... with, prepare meal, eat meal, look, inventory",
    )

    def default_games_dir(self) -> str:
        return str(Path("data/games") / f"tw-cooking-{self.params.level}")

    def tasks(self, split: str) -> list[Task]:
        from selective_rollout.envs.tw_cooking.games import ensure_games, load_tasks

        self.check_split(split)
        p, level = self.params, self.params.level
        if self.may_generate():
            if not (self.games_dir / split).is_dir():
                log.warning(
                    "generating the tw-cooking %s games (seed %d) into %s",
                    level,
                    p.games_seed,
                    self.games_dir,
                )
            ensure_games(self.games_dir, level, p.n_train, p.n_valid, p.games_seed)
        n = p.n_train if split == "train" else p.n_valid
        return load_tasks(self.games_dir, split, level, p.games_seed, n)

    def cache_key(self) -> list[Any]:
        return [*super().cache_key(), self.params.level]

    def source(self) -> seam.EpisodeSource:
        from selective_rollout.envs.tw_cooking.engine import CookingSource

        return CookingSource()

    def walkthrough(self, task: Task) -> list[str]:
        from selective_rollout.envs.tw_cooking.games import walkthrough

        return walkthrough(seam.game_dir(task))
