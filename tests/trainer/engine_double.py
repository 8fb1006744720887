"""A test double of a rollout engine's weight-sync surface: a plain HF model in a Ray actor.

It implements the methods the real engines expose (init_weight_sync, receive_weights,
load_weights, weights_checksum) plus ``logprobs`` so tests can check that a synced engine
scores tokens exactly as the learner does.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from selective_rollout.sync_group import TensorSpec, broadcast, make_sync_group
from selective_rollout.trainer.modeling import checksum, token_logprobs


class EngineDouble:
    def __init__(self, model_path: str) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.params = dict(self.model.named_parameters())
        self.group = None

    def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        self.group = make_sync_group(backend, host, port, rank, world_size)

    def receive_weights(self, specs: list[TensorSpec]) -> None:
        for spec in specs:
            buf = torch.empty(spec.shape, dtype=spec.torch_dtype)
            broadcast(self.group, buf, src=0)
            self.params[spec.name].data.copy_(buf)

    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        for name, tensor in named_tensors.items():
            self.params[name].data.copy_(tensor)

    def weights_checksum(self) -> float:
        return checksum(list(self.model.named_parameters()))

    def logprobs(self, token_ids: list[list[int]]) -> list[list[float]]:
        with torch.no_grad():
            return [
                token_logprobs(self.model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0][
                    0
                ].tolist()
                for ids in token_ids
            ]
