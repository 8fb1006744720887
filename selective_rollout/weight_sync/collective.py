"""A process group between the learner (rank 0) and the rollout engines, for weight sync.

The learners' own data-parallel group and the engines live in different processes that never
share a default ``torch.distributed`` world, so the sync group is built directly from a
TCPStore (as OpenRLHF and vLLM do with a stateless group): gloo on CPU, NCCL on GPU. Protocol:
rank 0 sends the list of ``TensorSpec`` through Ray, then broadcasts each tensor in that order.

A sync can be called off. A member that dies mid-sync leaves the others waiting for the
collective's timeout (300 s): NCCL never notices a dead peer, nor does gloo when the peer's
connections stay open (a lost node, a worker process that outlives its actor). So no member
blocks on a broadcast: each polls its transfer and, while it is pending, the group's store
for an ``ABORT_KEY`` that whoever notices a failure sets (``call_off``: the driver when a
member's Ray call fails, a member whose own broadcast fails). Seeing it, a member abandons the
group and raises ``SyncAborted`` within about ``POLL_STORE_S``; the group is then rebuilt.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import torch
import torch.distributed as dist

ABORT_KEY = "weight-sync-abort"  # in the group's TCPStore, outside the process group's own prefix
POLL_STORE_S = 0.2  # how often a pending broadcast looks at the store for ABORT_KEY
SYNC_TIMEOUT_S = 300.0  # the collective's own timeout (NCCL's and gloo's default), a last resort


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


class SyncAborted(RuntimeError):
    """This member stopped a weight sync: it was called off, or its own transfer failed."""


class SyncGroup:
    """One member's end of the sync group: the process group and the store it was built on."""

    # abandoned gloo groups whose transfer is still pending: kept alive, because destroying one
    # joins its worker thread, which waits out the collective's timeout (and gloo's abort() too)
    _abandoned: ClassVar[list[SyncGroup]] = []

    def __init__(self, pg: dist.ProcessGroup, store: dist.Store, backend: str, rank: int) -> None:
        self.pg, self.store, self.backend, self.rank = pg, store, backend, rank
        self.abandoned = False

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Broadcast one tensor in place from ``src``; returns when this member's part is done.

        Raises ``SyncAborted`` (and abandons the group) when the sync is called off while the
        transfer is pending or the backend reports an error (a peer's connection reset)."""
        if self.abandoned:
            raise SyncAborted("this weight-sync group was abandoned; it must be rebuilt")
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        work = self.pg.broadcast([tensor], opts)
        delay, next_look = 1e-4, time.monotonic() + POLL_STORE_S
        while not work.is_completed():
            if time.monotonic() >= next_look:
                if (reason := self.called_off()) is not None:
                    self.abandon()
                    raise SyncAborted(f"weight sync called off: {reason}")
                next_look = time.monotonic() + POLL_STORE_S
            time.sleep(delay)
            delay = min(2 * delay, 0.01)
        try:
            work.wait()  # raises the backend's error; on NCCL the current stream waits on the copy
        except Exception as exc:
            reason = f"rank {self.rank}'s broadcast failed: {type(exc).__name__}: {_first_line(exc)}"
            self.call_off(reason)
            self.abandon()
            raise SyncAborted(reason) from exc

    def called_off(self) -> str | None:
        """Why the sync was called off, or None; a store that cannot be reached (its host, the
        learner, is gone) counts as called off."""
        try:
            if not self.store.check([ABORT_KEY]):
                return None
            return self.store.get(ABORT_KEY).decode(errors="replace")
        except Exception as exc:
            return f"the sync group's store is unreachable ({type(exc).__name__}: {_first_line(exc)})"

    def call_off(self, reason: str) -> None:
        """Tell every member to stop (best effort: a store that is gone has told them already)."""
        with contextlib.suppress(Exception):
            self.store.set(ABORT_KEY, reason)

    def abandon(self) -> None:
        """Stop using this group: NCCL's communicator is aborted (that ends a kernel stuck on a
        dead peer); a gloo group is only dropped, since its abort() waits for the pending transfer."""
        if self.abandoned:
            return
        self.abandoned = True
        if self.backend == "nccl":
            with contextlib.suppress(Exception):  # the caller's SyncAborted is the error to report
                self.pg.abort()
        else:
            SyncGroup._abandoned.append(self)


def call_off(host: str, port: int, reason: str, timeout_s: float = 10.0) -> bool:
    """Call off the sync of the group whose store is at ``host:port``, from outside it (the
    driver); False when the store cannot be reached (its members then fail on their own)."""
    try:
        store = dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        store.set(ABORT_KEY, reason)
    except Exception:
        return False
    return True


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def make_sync_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float = SYNC_TIMEOUT_S,
    group_name: str = "weight-sync",
) -> SyncGroup:
    """Join (rank > 0) or host (rank 0, which also hosts the store) a standalone group; every
    rank must call it."""
    store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timedelta(seconds=timeout_s))
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        pg: dist.ProcessGroup = dist.ProcessGroupGloo(
            prefixed, rank, world_size, timedelta(seconds=timeout_s)
        )
    elif backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout_s)
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    else:
        raise ValueError(f"weight-sync backend must be 'gloo' or 'nccl', got {backend!r}")
    return SyncGroup(pg, store, backend, rank)


def broadcast(group: SyncGroup, tensor: torch.Tensor, src: int = 0) -> None:
    """Broadcast one tensor in place from ``src`` over the sync group (``SyncGroup.broadcast``)."""
    group.broadcast(tensor, src)
