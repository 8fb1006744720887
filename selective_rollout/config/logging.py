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
    regime_k: int | None = Field(
        None,
        ge=1,
        description="the step at which the report's regime row measures D_K, the spread of the "
        "groups' action prefixes where a divergence gate would read them (the paper: K = 10 of "
        "30 steps); default: the gate's k; at most rollout.max_steps. Set it when the run's gate reads "
        "something else at another step (the CPU profile's stalled gate at 11 of 15 steps: its "
        "regime is read at 4)",
    )
