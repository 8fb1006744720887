"""Config of the environment side (alfworld_env): which games, how many env workers."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class EnvConfig(Section):
    source: Literal["generated", "official"] = "generated"
    games_dir: str = "data/games/tiny"
    preset: Literal["tiny", "small", "full"] = "tiny"
    num_workers: int = Field(2, ge=1)
    max_steps: int = Field(15, ge=1)
