"""Config of the environment side (selective_rollout.envs): which environment, which games, how
many env workers.

The section holds what every environment shares (``name``, the games folder and set sizes, the
workers) and, as flat keys, the parameters of the selected environment (``env.preset=medium``
for ALFWorld, ``env.level=hard`` for TextWorld Cooking), declared by the environment's own
``Params`` model in the registry: a new environment needs no change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from selective_rollout.config.base import EntrySection
from selective_rollout.envs import ENVS, env_class  # the package registers the shipped environments

if TYPE_CHECKING:
    from selective_rollout.envs.base import Environment


class EnvConfig(EntrySection):
    """The environment, its games and the env workers that play them (docs/environment.md).

    Besides the keys below, the selected environment's own parameters are keys of this section;
    any other key is refused with one line naming it.
    """

    selector = "name"
    kind = "environment"

    name: str = Field(
        "alfworld",
        description="a registered environment: alfworld (ALFWorld households), tw-cooking (TextWorld "
        "Cooking), or your own (docs/environment.md); its own keys are listed below",
    )
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
    num_workers: int = Field(2, ge=1, description="env worker actors; each hosts many episodes")

    @classmethod
    def entries(cls) -> Mapping[str, Any]:
        return ENVS

    def build(self) -> Environment:
        """The selected environment, bound to this section (what the coordinator, the task
        source and the warm start use)."""
        return env_class(self.name)(self)
