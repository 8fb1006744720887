"""ALFWorld (``env.name: alfworld``, the default): ``alfworld_env`` behind the seam, unchanged.

Generated ALFWorld-domain games (``env.preset``) or the official data (``env.source: official``),
played by the real ALFWorld text engine in the env pool's Ray workers (``AlfworldSource``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from selective_rollout.envs.base import (
    Environment,
    Episode,
    Observation,
    PromptText,
    folder_task,
    game_dir,
)
from selective_rollout.envs.game_folders import GameFolderParams, GameFolders
from selective_rollout.records import Task

if TYPE_CHECKING:
    from alfworld_env.games import GameInfo

log = logging.getLogger(__name__)

_TASK_MARK = "Your task is to:"
GAME_FILE = "game.tw-pddl"


class AlfworldParams(GameFolderParams):
    source: Literal["generated", "official"] = Field(
        "generated",
        description="generated: offline ALFWorld-domain games (alfworld_env); "
        "official: $ALFWORLD_DATA/json_2.1.1",
    )
    preset: str = Field(
        "tiny",
        description="difficulty of generated games: one of alfworld_env.PRESETS (tiny, medium, small, "
        "full), or a mix such as tiny+small, dealt in blocks of six games",
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        from alfworld_env.presets import preset_of  # plain data: no engine, no Ray

        preset_of(value, 0)  # raises ValueError naming the known presets
        return value


class Alfworld(GameFolders, Environment):
    """ALFWorld household tasks on the real ALFWorld engine (generated games or the official data)."""

    Params = AlfworldParams
    params: AlfworldParams
    prompt = PromptText(
        world="a household text game",
        commands="go to, take, move, open, close, heat, cool, clean, use, examine, look, inventory",
    )

    def default_games_dir(self) -> str:
        return str(Path("data/games") / self.params.preset)

    def tasks(self, split: str) -> list[Task]:
        from alfworld_env import ensure_games, load_games, load_generated

        self.check_split(split)
        p = self.params
        if p.source == "official":
            games = load_games(self.games_dir, split, source="official")
        else:
            if self.may_generate():
                if not (self.games_dir / split).is_dir():
                    log.warning(
                        "generating the %s games (seed %d) into %s", p.preset, p.games_seed, self.games_dir
                    )
                ensure_games(
                    self.games_dir,
                    preset=p.preset,
                    n_train=p.n_train,
                    n_valid=p.n_valid,
                    seed=p.games_seed,
                )
            n = p.n_train if split == "train" else p.n_valid
            games = load_generated(self.games_dir, split, p.preset, p.games_seed, n)
        return [game_task(g) for g in games]

    def cache_key(self) -> list[Any]:
        return [*super().cache_key(), self.params.preset]

    def source(self) -> AlfworldSource:
        return AlfworldSource()

    def walkthrough(self, task: Task) -> list[str]:
        game = json.loads((game_dir(task) / GAME_FILE).read_text())
        return list(game.get("walkthrough") or [])


def game_task(game: GameInfo) -> Task:
    """The task of one ALFWorld game folder (generated or official)."""
    return folder_task(game.game_dir, game.task_id, game.task_type)


@dataclass(frozen=True)
class AlfworldSource:
    """ALFWorld PDDL games (``<game_dir>/game.tw-pddl``) opened on the real engine; the workers
    cache the parsed domain and the translations across episodes (``alfworld_env.speedups``)."""

    parse_cache: bool = True

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        from alfworld_env.errors import GameError

        return (GameError,)

    def prepare(self) -> None:
        from alfworld_env import speedups

        speedups.enable(parse_cache=self.parse_cache, translation_cache=True)

    def open(self, task: Task, n: int) -> list[Episode]:
        from alfworld_env.engine import Episode as AlfworldEpisode

        game = json.loads((game_dir(task) / GAME_FILE).read_text())
        return [AlfworldEpisode(game) for _ in range(n)]

    def task_sentence(self, first: Observation) -> str:
        return first.obs.split(_TASK_MARK, 1)[1].strip() if _TASK_MARK in first.obs else ""

    def describe(self, task: Task) -> str:
        return str(game_dir(task) / GAME_FILE)
