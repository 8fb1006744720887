"""A test double of a rollout engine's weight-sync surface: a plain HF model in a Ray actor.

It implements the methods the real engines expose (init_weight_sync, receive_weights,
load_weights, score, weights_checksum, health) plus ``logprobs`` so tests can check that a synced engine
scores tokens exactly as the learner does, and ``die_during_next_sync`` to stand for an engine
that dies in the middle of a broadcast.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import AutoModelForCausalLM

from selective_rollout.learner.modeling import checksum, token_logprobs
from selective_rollout.weight_sync.collective import TensorSpec, broadcast, make_sync_group


class EngineDouble:
    """``tp`` > 1 stands for a tensor-parallel engine: that many worker processes join the group
    (here threads, each with its own rank and its own copy of what it received), as vLLM's do."""

    def __init__(self, model_path: str, tp: int = 1, blank: bool = False) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.params = dict(self.model.named_parameters())
        if blank:  # zero weights: only a sync that sends every tensor makes it score like the learner
            with torch.no_grad():
                for p in self.params.values():
                    p.zero_()
        self.tp = tp
        self.groups: list = []
        self.worker_sums: list[float] = []
        self.sync_sockets: list[int] = []
        self.dying: tuple[int, str, bool] | None = None

    def sync_workers(self) -> int:
        return self.tp

    def health(self) -> dict:
        return {"alive": True}

    def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        before = _sockets()
        with ThreadPoolExecutor(self.tp) as pool:  # every worker must join before any returns
            self.groups = list(
                pool.map(lambda w: make_sync_group(backend, host, port, rank + w, world_size), range(self.tp))
            )
        self.sync_sockets = sorted(_sockets() - before)  # the group's connections (and its store's)

    def die_during_next_sync(self, after: int, sink: str, hold_open: bool) -> None:
        """After receiving ``after`` tensors of the next sync, tell the test at the UNIX socket
        ``sink`` and wait there to be killed (``ray.kill``). With ``hold_open`` the message carries
        this engine's sync-group sockets, so the test keeps its connections open after the kill:
        the peers see no reset, as with NCCL or a lost node, and only a called-off sync ends."""
        self.dying = (after, sink, hold_open)

    def _receive(self, worker: int, specs: list[TensorSpec]) -> list[torch.Tensor]:
        bufs = []
        for i, spec in enumerate(specs):
            if self.dying is not None and worker == 0 and i == self.dying[0]:
                _, sink, hold_open = self.dying
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(sink)
                    socket.send_fds(s, [str(os.getpid()).encode()], self.sync_sockets if hold_open else [])
                time.sleep(600)  # killed here
            buf = torch.empty(spec.shape, dtype=spec.torch_dtype)
            broadcast(self.groups[worker], buf, src=0)
            bufs.append(buf)
        return bufs

    def receive_weights(self, specs: list[TensorSpec], version: int) -> None:
        del version  # a double serves one model: its version is the test's to know
        with ThreadPoolExecutor(self.tp) as pool:
            received = list(pool.map(lambda w: self._receive(w, specs), range(self.tp)))
        for spec, buf in zip(specs, received[0], strict=True):
            self.params[spec.name].data.copy_(buf)
        self.worker_sums = [float(sum(b.double().sum() for b in bufs)) for bufs in received]

    def worker_checksums(self) -> list[float]:
        """What each worker received in the last broadcast (float64 sums, as ``weights_checksum``)."""
        return self.worker_sums

    def load_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        del version
        for name, tensor in named_tensors.items():
            self.params[name].data.copy_(tensor)

    def weights_checksum(self) -> float:
        return checksum(list(self.model.named_parameters()))

    def score(self, token_ids: list[int]) -> list[float]:
        return self.logprobs([token_ids])[0]

    def logprobs(self, token_ids: list[list[int]]) -> list[list[float]]:
        with torch.no_grad():
            return [
                token_logprobs(self.model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
                .logprobs[0]
                .tolist()
                for ids in token_ids
            ]


def _sockets() -> set[int]:
    """This process's open socket descriptors."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                out.add(int(fd))
        except OSError:
            pass
    return out
