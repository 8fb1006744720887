"""Config of the learner (selective_rollout.trainer): GRPO objective, DeepSpeed, LoRA, sync, checkpoints."""

from typing import Literal

from pydantic import Field, field_validator

from selective_rollout.config.base import Section


class LoraConfig(Section):
    """LoRA through peft. Engines receive the base weights with the adapter folded in, under the
    base names: neither engine back-end loads a peft adapter on its own."""

    enabled: bool = False
    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class TrainerConfig(Section):
    # advantages (selective_rollout.trainer.advantages registry; a new estimator adds its name here)
    advantage: Literal["grpo", "drgrpo"] = "grpo"
    advantage_eps: float = Field(1e-6, gt=0.0)
    # policy loss
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: float = Field(0.28, ge=0.0)
    old_logprobs: Literal["learner", "engine"] = Field(
        "learner",
        description="the PPO ratio's old policy: learner = the learner's own log-probs before its one update "
        "per batch (ratio exactly 1, no spurious clipping from bf16 or vLLM numerics); engine = the "
        "sampling engine's log-probs",
    )
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the KL to the frozen initial policy")
    kl_estimator: Literal["k1", "k3"] = "k3"
    # optimiser
    lr: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float = Field(1.0, ge=0.0, description="0 disables clipping")
    micro_batch_tokens: int = Field(4096, ge=1, description="padded tokens per forward/backward")
    gradient_checkpointing: bool = False
    # system
    num_learners: int = Field(1, ge=1)
    zero_stage: int = Field(0, ge=0, le=3)
    precision: Literal["fp32", "bf16"] = "fp32"
    lora: LoraConfig = LoraConfig()
    weight_sync: Literal["auto", "gloo", "nccl", "object_store"] = Field(
        "auto", description="auto: nccl when the learner has a GPU, else gloo"
    )
    # checkpoints (the driver calls save every `save_every` iterations)
    save_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    resume: Literal["auto", "never"] = "auto"

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_unit_interval(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"each beta must be in [0, 1), got {list(value)}")
        return value
