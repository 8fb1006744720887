"""Loading learner weights into an in-process HF model, by broadcast or by value.

The learner sends merged full weights under the HF ``named_parameters()`` names; the engine
side checks every name and shape before copying, so a mismatch (a LoRA name that was not
merged, a different model) is one clear error instead of a silently half-updated model.
"""

from __future__ import annotations

import torch

from selective_rollout.weight_sync.collective import SyncAborted, TensorSpec, broadcast, make_sync_group


class WeightReceiver:
    """The engine's end of the weight-sync protocol in selective_rollout.weight_sync.collective."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.params = dict(model.named_parameters())
        self.group = None

    def join(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        if rank == 0:
            raise ValueError("an engine cannot be rank 0 of the weight-sync group: rank 0 is the learner")
        self.group = make_sync_group(backend, host, port, rank, world_size)

    def _target(self, name: str, shape: tuple[int, ...]) -> torch.nn.Parameter:
        param = self.params.get(name)
        if param is None:
            raise KeyError(f"weight {name!r} is not a parameter of the engine's model")
        if tuple(param.shape) != tuple(shape):
            raise ValueError(f"weight {name!r}: shape {tuple(shape)} != engine's {tuple(param.shape)}")
        return param

    @torch.no_grad()
    def receive(self, specs: list[TensorSpec]) -> None:
        """One broadcast per spec, in order (every spec is received even if it is misnamed).

        A sync called off midway (``SyncAborted``) leaves the model partly updated and the group
        unusable: the driver rebuilds the group and syncs again before the engine generates."""
        if self.group is None:
            raise RuntimeError("receive_weights called before init_weight_sync (or after a failed sync)")
        try:
            for spec in specs:
                param = self._target(spec.name, spec.shape)
                buf = torch.empty(spec.shape, dtype=spec.torch_dtype, device=param.device)
                broadcast(self.group, buf, src=0)
                param.copy_(buf)
        except SyncAborted:
            self.group = None
            raise

    @torch.no_grad()
    def load(self, named_tensors: dict[str, torch.Tensor]) -> None:
        targets = {name: self._target(name, tuple(t.shape)) for name, t in named_tensors.items()}
        for name, tensor in named_tensors.items():
            targets[name].copy_(tensor)

    @torch.no_grad()
    def checksum(self) -> float:
        return float(sum(p.detach().double().sum() for p in self.params.values()))
