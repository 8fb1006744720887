"""Config of the learner (selective_rollout.trainer)."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class TrainerConfig(Section):
    advantage: Literal["grpo", "drgrpo"] = "grpo"
    lr: float = Field(1e-5, gt=0.0)
    num_learners: int = Field(1, ge=1)
    zero_stage: int = Field(0, ge=0, le=3)
