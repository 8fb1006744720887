"""Config of the environment side (selective_rollout.envs): which environment, which tasks, how
many env workers.

The section holds what every environment shares (``name``, the workers, stop strings) and, as
flat keys, the parameters of the selected environment (``env.preset=medium`` for ALFWorld,
``env.games_dir`` for an environment of game folders, ``env.data_files`` for skyrl-gym), declared
by the environment's own ``Params`` model (read through ``ENVS``): a new environment
needs no change here.
"""

from __future__ import annotations

from pydantic import Field

from selective_rollout.config.base import EntrySection
from selective_rollout.envs.base import ENVS, Environment, EnvParams

_SHARED = EnvParams.model_fields


class EnvConfig(EntrySection):
    """The environment, its games and the env workers that play them (docs/environment.md).

    Besides the keys below, the selected environment's own parameters are keys of this section;
    any other key is refused with one line naming it.
    """

    selector = "name"
    registry_at = "selective_rollout.envs.base:ENVS"

    name: str = Field(
        "alfworld",
        description="a registered environment: alfworld (ALFWorld households), tw-cooking (TextWorld "
        "Cooking), skyrl_gym (skyrl-gym environments on rows of data files), gymnasium (a gymnasium "
        "text environment by its id), or your own (docs/environment.md); its own keys are listed below",
    )
    # the parameters every environment has, declared once by the environment seam (the game-folder
    # keys, games_dir and the set sizes, belong to the environments that have folders)
    num_workers: int = _SHARED["num_workers"]
    stop: list[str] = _SHARED["stop"]

    def build(self) -> Environment:
        """The selected environment, bound to this section (what the coordinator, the task
        source and the warm start use)."""
        return ENVS.build(self.name, self)
