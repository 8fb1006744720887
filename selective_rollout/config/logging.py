"""Config of metric logging: JSONL always, wandb (offline by default), TensorBoard optional."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class LoggingConfig(Section):
    backends: list[Literal["jsonl", "wandb", "tensorboard"]] = Field(
        default_factory=lambda: ["jsonl", "wandb"]
    )
    wandb_project: str = "selective-rollout"
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline by default; WANDB_MODE in the environment wins"
    )
    progress: bool = True
