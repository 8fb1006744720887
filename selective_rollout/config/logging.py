"""Config of metric logging: JSONL always, wandb (offline by default), TensorBoard optional."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class LoggingConfig(Section):
    """Where metrics go: metrics.jsonl always, plus wandb / TensorBoard."""

    backends: list[Literal["jsonl", "wandb", "tensorboard"]] = Field(
        default_factory=lambda: ["jsonl", "wandb"]
    )
    wandb_project: str = Field("selective-rollout", description="wandb project name")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline by default; WANDB_MODE in the environment wins"
    )
    progress: bool = Field(True, description="progress bars (throttled for non-TTY logs)")
