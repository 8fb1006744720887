"""Config of the rollout engines (selective_rollout.rollout.engines) and the model."""

from typing import Literal

from pydantic import Field, field_validator

from selective_rollout.config.base import Section

# Below MIN_TEMPERATURE, logits / T overflows to inf in fp32 and the softmax is NaN: use 0 (greedy).
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0


class EngineConfig(Section):
    backend: Literal["transformers", "vllm"] = "transformers"
    model: str = Field("smollm2-135m-instruct", description="alias, local folder or HF id (models.py)")
    model_cache_dir: str | None = Field(None, description="where aliases are converted; None = ~/.cache")
    num_engines: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(32, ge=1)
    seed: int = Field(0, ge=0, description="seeds requests that carry no seed of their own")
    # Ray resources of one engine actor.
    num_cpus: float = Field(1.0, gt=0.0)
    num_gpus: float = Field(0.0, ge=0.0, description="0 on CPU; vLLM on a cluster: tensor_parallel_size")
    # transformers back-end.
    threads: int = Field(0, ge=0, description="torch threads per engine; 0 = torch's default")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    max_batch_size: int = Field(64, ge=1, description="sequences decoded together")
    kv_cache_tokens: int = Field(65536, ge=0, description="session KV kept across turns (tokens)")
    # vLLM back-end.
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=64)
    enforce_eager: bool = False
    enable_prefix_caching: bool = True

    @field_validator("temperature")
    @classmethod
    def _usable_temperature(cls, value: float) -> float:
        if value != 0 and not MIN_TEMPERATURE <= value <= MAX_TEMPERATURE:
            raise ValueError(f"must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {value}")
        return value
