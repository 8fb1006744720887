"""Config of the driver (selective_rollout.driver), held-out evaluation and warm start.

The driver's section is ``driver:``, the learner's ``trainer:``."""

from typing import Literal

from pydantic import Field, model_validator

from selective_rollout.config.base import Section


class DriverConfig(Section):
    """The driver's loop (selective_rollout.driver); ``train:`` is a deprecated spelling of it."""

    iterations: int = Field(3, ge=1)
    eval_every: int = Field(
        0, ge=0, description="held-out evaluation every N iterations (0: before/after only)"
    )
    runs_dir: str = Field("runs", description="parent folder of run folders")
    run_dir: str | None = Field(
        None, description="explicit run folder; reusing one resumes it (trainer.resume=auto)"
    )
    task_shuffle_seed: int = Field(0, description="order of the train task stream (same seed = same stream)")
    stall_timeout_s: float = Field(
        900.0,
        gt=0,
        description="stop with one clear line when a rollout or evaluation makes no progress (no token "
        "generated, no env step) for this long, instead of waiting forever",
    )
    pipeline: Literal["sync", "async", "stream"] = Field(
        "sync",
        description="sync: each iteration rolls out, then trains while the engines wait, then syncs; "
        "async: the next iteration's rollout runs on the engines while the learner trains on this "
        "one, under weights at most driver.max_staleness updates old; stream: groups play without a "
        "break and fill batches as they settle, a group starts only within the bound and one that "
        "settles beyond it is dropped as stale (selective_rollout.driver.pipeline)",
    )
    max_staleness: int = Field(
        1,
        ge=1,
        description="async, stream: how many learner updates a trained group's rollout weights may "
        "lag behind; the weights are synced only as often as the bound needs",
    )
    sync_in_flight: bool = Field(
        False,
        description="async, stream: send each update to the engines as soon as it is made, while "
        "groups are in flight (their later turns, on vLLM their later tokens too, are sampled by the "
        "new weights; each token carries its version), instead of only when the bound needs it",
    )
    update_check: bool = Field(
        False,
        description="after the start-up sync, take one optimiser step on a constructed group whose "
        "rewards differ and require the engines to serve the moved weights (smoke checks and "
        "rehearsals: it changes the policy the run starts from; selective_rollout.driver.update_check)",
    )

    @property
    def pipelined(self) -> bool:
        """Rollouts and learner updates overlap (``async`` or ``stream``): trained tokens may be
        sampled by older weights."""
        return self.pipeline != "sync"

    @model_validator(mode="after")
    def _in_flight_needs_a_pipeline(self) -> "DriverConfig":
        if self.sync_in_flight and not self.pipelined:
            raise ValueError(
                "driver.sync_in_flight=true needs driver.pipeline=async or stream: a sync pipeline "
                "has no rollout in flight while the learner updates"
            )
        return self


class EvalConfig(Section):
    """Held-out evaluation, before and after training and every ``driver.eval_every`` iterations."""

    split: str = Field(
        "valid_unseen",
        description="the held-out split, one of the environment's own (alfworld, tw-cooking: train, "
        "valid_seen, valid_unseen; gymnasium: train, test; skyrl_gym: those of its data files)",
    )
    num_tasks: int = Field(8, ge=1, description="held-out tasks per evaluation (first N of the split)")
    tries: int = Field(1, ge=1, description="episodes per task; success = mean over tries")
    greedy: bool = Field(True, description="greedy decoding; false samples at engine.temperature")
    max_in_flight: int = Field(
        1,
        ge=1,
        description="held-out tasks played at once; 1 makes greedy evaluation repeatable (in a "
        "batch, bf16 rounding depends on which requests share a forward, and a greedy choice can flip)",
    )
    bootstrap: int = Field(1000, ge=100, description="bootstrap resamples for the 95% CI")


class WarmStartConfig(Section):
    """Behaviour cloning of the solver's walkthroughs before RL (selective_rollout.sft)."""

    enabled: bool = Field(False, description="behaviour-clone walkthroughs before RL (cached per config)")
    games: int = Field(24, ge=1, description="train games whose walkthroughs are cloned")
    epochs: int = Field(2, ge=1)
    lr: float = Field(5e-5, gt=0.0)
    seed: int = Field(
        0,
        description="data order of the warm start (kept apart from the run seed so the "
        "arms and seeds of an experiment share one warm start)",
    )
    cache_dir: str = Field("~/.cache/selective_rollout/warm_start", description="built once, reused by key")
