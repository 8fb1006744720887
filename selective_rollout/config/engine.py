"""Config of the rollout engines (selective_rollout.rollout.engines) and the model."""

from typing import Literal

from pydantic import Field

from selective_rollout.config.base import Section


class EngineConfig(Section):
    backend: Literal["transformers", "vllm"] = "transformers"
    model: str = "smollm2-135m-instruct"
    num_engines: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(32, ge=1)
