"""ALFWorld (``env.name: alfworld``, the default): ``alfworld_env`` behind the seam, unchanged.

Generated ALFWorld-domain games (``env.preset``) or the official data (``env.source: official``),
played by the real ALFWorld text engine in ``alfworld_env.EnvPool``'s Ray workers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from selective_rollout.envs.base import (
    Environment,
    EnvParams,
    EnvPool,
    Episode,
    Observation,
    PromptText,
)
from selective_rollout.records import Task

log = logging.getLogger(__name__)

_TASK_MARK = "Your task is to:"


class AlfworldParams(EnvParams):
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


class Alfworld(Environment):
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
        return [Task(g.game_dir, g.task_id, g.task_type) for g in games]

    def cache_key(self) -> list[Any]:
        return [*super().cache_key(), self.params.preset]

    def pool(self, worker_options: dict[str, Any] | None = None) -> EnvPool:
        from alfworld_env import EnvPool as AlfworldPool

        return AlfworldPool(self.params.num_workers, worker_options)

    def episode(self, game_dir: str) -> Episode:
        from alfworld_env.engine import Episode as AlfworldEpisode

        return AlfworldEpisode(json.loads((Path(game_dir) / "game.tw-pddl").read_text()))

    def walkthrough(self, game_dir: str) -> list[str]:
        game = json.loads((Path(game_dir) / "game.tw-pddl").read_text())
        return list(game.get("walkthrough") or [])

    def task_of(self, first: Observation) -> str:
        return first.obs.split(_TASK_MARK, 1)[-1].strip()
