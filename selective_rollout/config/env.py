"""Config of the environment side (alfworld_env): which games, how many env workers."""

from typing import Literal

from pydantic import Field, field_validator

from selective_rollout.config.base import Section


class EnvConfig(Section):
    """The games and the env workers that play them (docs/environment.md)."""

    source: Literal["generated", "official"] = Field(
        "generated",
        description="generated: our offline ALFWorld-domain games; official: $ALFWORLD_DATA/json_2.1.1",
    )
    games_dir: str = Field(
        "data/games/tiny",
        description="games root; generated games are made there when missing only for data/games/<preset> "
        "or with env.generate",
    )
    generate: bool = Field(
        False, description="generate missing games into a games_dir other than data/games/<preset>"
    )
    preset: str = Field(
        "tiny",
        description="difficulty of generated games: one of alfworld_env.PRESETS (tiny, medium, small, "
        "full), or a mix such as tiny+small, dealt in blocks of six games",
    )
    games_seed: int = Field(0, description="seed of the generated game set (kept apart from the run seed)")
    n_train: int = Field(60, ge=1, description="generated train games")
    n_valid: int = Field(24, ge=1, description="generated games in each of valid_seen and valid_unseen")
    num_workers: int = Field(2, ge=1, description="env worker actors; each hosts many episodes")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        from alfworld_env.generate import preset_of  # the generator owns the presets

        preset_of(value, 0)  # raises ValueError naming the known presets
        return value
