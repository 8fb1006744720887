"""A process group between the learner (rank 0) and the rollout engines, for weight sync.

The learners' own data-parallel group and the engines live in different processes that never
share a default ``torch.distributed`` world, so the sync group is built directly from a
TCPStore (as OpenRLHF and vLLM do with a stateless group): gloo on CPU, NCCL on GPU. Protocol:
rank 0 sends the list of ``TensorSpec`` through Ray, then broadcasts each tensor in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32", a torch dtype attribute name

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))


def sync_ranks(workers_per_engine: list[int]) -> tuple[list[int], int]:
    """Each engine's first rank in the sync group, and the group's size.

    The learner is rank 0; every process of every engine that holds weights joins (a vLLM engine
    with tensor parallelism ``TP`` has ``TP`` workers, which take ``first + worker rank``), so
    engine ``i`` starts at ``1 + sum of the workers before it`` and the group has
    ``1 + sum of all workers`` ranks (``1 + i * TP`` and ``1 + engines * TP`` when all are alike).
    """
    if any(w < 1 for w in workers_per_engine):
        raise ValueError(f"every engine has at least one worker, got {workers_per_engine}")
    firsts, nxt = [], 1
    for workers in workers_per_engine:
        firsts.append(nxt)
        nxt += workers
    return firsts, nxt


def make_sync_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float = 300.0,
    group_name: str = "weight-sync",
) -> dist.ProcessGroup:
    """Join (rank > 0) or host (rank 0) a standalone group; every rank must call it."""
    store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timedelta(seconds=timeout_s))
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timedelta(seconds=timeout_s))
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout_s)
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    raise ValueError(f"weight-sync backend must be 'gloo' or 'nccl', got {backend!r}")


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor, src: int = 0) -> None:
    """Broadcast one tensor in place from ``src`` over the sync group and wait for it."""
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    group.broadcast([tensor], opts).wait()
