"""A test double of a rollout engine's weight-sync surface: a plain HF model in a Ray actor.

It implements the methods the real engines expose (init_weight_sync, receive_weights,
load_weights, weights_checksum) plus ``logprobs`` so tests can check that a synced engine
scores tokens exactly as the learner does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import AutoModelForCausalLM

from selective_rollout.trainer.modeling import checksum, token_logprobs
from selective_rollout.weight_sync.collective import TensorSpec, broadcast, make_sync_group


class EngineDouble:
    """``tp`` > 1 stands for a tensor-parallel engine: that many worker processes join the group
    (here threads, each with its own rank and its own copy of what it received), as vLLM's do."""

    def __init__(self, model_path: str, tp: int = 1) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.params = dict(self.model.named_parameters())
        self.tp = tp
        self.groups: list = []
        self.worker_sums: list[float] = []

    def sync_workers(self) -> int:
        return self.tp

    def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        with ThreadPoolExecutor(self.tp) as pool:  # every worker must join before any returns
            self.groups = list(
                pool.map(lambda w: make_sync_group(backend, host, port, rank + w, world_size), range(self.tp))
            )

    def _receive(self, worker: int, specs: list[TensorSpec]) -> list[torch.Tensor]:
        bufs = []
        for spec in specs:
            buf = torch.empty(spec.shape, dtype=spec.torch_dtype)
            broadcast(self.groups[worker], buf, src=0)
            bufs.append(buf)
        return bufs

    def receive_weights(self, specs: list[TensorSpec]) -> None:
        with ThreadPoolExecutor(self.tp) as pool:
            received = list(pool.map(lambda w: self._receive(w, specs), range(self.tp)))
        for spec, buf in zip(specs, received[0], strict=True):
            self.params[spec.name].data.copy_(buf)
        self.worker_sums = [float(sum(b.double().sum() for b in bufs)) for bufs in received]

    def worker_checksums(self) -> list[float]:
        """What each worker received in the last broadcast (float64 sums, as ``weights_checksum``)."""
        return self.worker_sums

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
