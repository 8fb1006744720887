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

On NCCL that abandon has to be this code's to make: torch's default async error handling
(``TORCH_NCCL_ASYNC_ERROR_HANDLING`` 3, SkipCleanUp) ends the whole process on a NCCL error or
timeout, which would take learner rank 0 down with a dead engine. The sync group is therefore
built with CleanUpOnly (2: the communicator is aborted and the transfer fails, the process lives),
scoped to its own construction (``nccl_error_handling``): the variable is read per process group
when it is made, so DeepSpeed's and vLLM's own groups keep their setting.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import torch
import torch.distributed as dist

ABORT_KEY = "weight-sync-abort"  # in the group's TCPStore, outside the process group's own prefix
POLL_STORE_S = 0.2  # how often a pending broadcast looks at the store for ABORT_KEY
SYNC_TIMEOUT_S = 300.0  # the collective's own timeout (NCCL's and gloo's default), a last resort
# A pending transfer is first checked this many times without sleeping (about a millisecond: a
# small tensor is done by then), then between sleeps that double from FIRST_SLEEP_S to MAX_SLEEP_S.
SPIN_CHECKS = 1000
FIRST_SLEEP_S = 2e-5
MAX_SLEEP_S = 1e-3
# Read by ProcessGroupNCCL's constructor (before its older name NCCL_ASYNC_ERROR_HANDLING, which it
# also reads); 2 is CleanUpOnly.
NCCL_ERROR_HANDLING_VAR = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_CLEAN_UP_ONLY = "2"


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
        self._wait(work)
        try:
            work.wait()  # raises the backend's error; on NCCL the current stream waits on the copy
        except Exception as exc:
            reason = f"rank {self.rank}'s broadcast failed: {type(exc).__name__}: {_first_line(exc)}"
            self.call_off(reason)
            self.abandon()
            raise SyncAborted(reason) from exc

    def _wait(self, work: dist.Work) -> None:
        """Return once ``work`` is no longer pending, looking at the store every ``POLL_STORE_S``.

        A transfer that finishes within ``SPIN_CHECKS`` checks costs no sleep at all (a model has
        hundreds of small tensors: a fixed sleep each would add up); a longer one is checked
        between sleeps that start at ``FIRST_SLEEP_S``, so its end is seen at most about that
        much late at first and ``MAX_SLEEP_S`` late at worst."""
        spins, delay = SPIN_CHECKS, FIRST_SLEEP_S
        next_look = time.monotonic() + POLL_STORE_S
        while not work.is_completed():
            if time.monotonic() >= next_look:
                if (reason := self.called_off()) is not None:
                    self.abandon()
                    raise SyncAborted(f"weight sync called off: {reason}")
                next_look = time.monotonic() + POLL_STORE_S
            if spins:
                spins -= 1
                os.sched_yield()  # releases the GIL: a peer rank may be a thread of this process
            else:
                time.sleep(delay)
                delay = min(2 * delay, MAX_SLEEP_S)

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
            _set_reason(self.store, reason)

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
        _set_reason(store, reason)
    except Exception:
        return False
    return True


def _set_reason(store: dist.Store, reason: str) -> None:
    """Set ``ABORT_KEY`` unless it is set: the first reason is the cause, later ones follow from it
    (a member stopped by the call-off, the driver seeing that member's call fail)."""
    store.compare_set(ABORT_KEY, "", reason)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


class _ScopedEnv:
    """One environment variable set while any thread is inside ``scope``, and put back as it was
    (its value, or its absence) when the last one leaves. A count, not a lock held across the
    body: the ranks a process hosts (threads of an engine double) build their groups at the same
    time and wait for each other inside."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._inside = 0
        self._saved: str | None = None

    @contextlib.contextmanager
    def scope(self, value: str) -> Iterator[None]:
        with self._lock:
            if not self._inside:
                self._saved = os.environ.get(self.name)
            self._inside += 1
            os.environ[self.name] = value
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if not self._inside:
                    if self._saved is None:
                        os.environ.pop(self.name, None)
                    else:
                        os.environ[self.name] = self._saved


_NCCL_ERROR_HANDLING = _ScopedEnv(NCCL_ERROR_HANDLING_VAR)


def nccl_error_handling(mode: str) -> contextlib.AbstractContextManager[None]:
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING=mode`` for the process groups made inside the block only."""
    return _NCCL_ERROR_HANDLING.scope(mode)


def host_store(host: str, world_size: int, timeout_s: float = SYNC_TIMEOUT_S) -> dist.TCPStore:
    """Rank 0's store on a port the system picks (``store.port``): it listens from the start, so
    no other process can take the port between choosing it and handing it to the other ranks."""
    return dist.TCPStore(
        host, 0, world_size, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def group_on_store(
    store: dist.TCPStore,
    backend: str,
    rank: int,
    world_size: int,
    timeout_s: float = SYNC_TIMEOUT_S,
    group_name: str = "weight-sync",
) -> SyncGroup:
    """This member's end of the group whose rendezvous is ``store``; every rank must call it. On
    NCCL the group is made with CleanUpOnly error handling (``nccl_error_handling``)."""
    prefixed = dist.PrefixStore(group_name, store)
    timeout = timedelta(seconds=timeout_s)
    with nccl_error_handling(NCCL_CLEAN_UP_ONLY):
        if backend == "gloo":
            pg: dist.ProcessGroup = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
        else:
            raise ValueError(f"weight-sync backend must be 'gloo' or 'nccl', got {backend!r}")
    return SyncGroup(pg, store, backend, rank)


def make_sync_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float = SYNC_TIMEOUT_S,
    group_name: str = "weight-sync",
) -> SyncGroup:
    """Join (rank > 0) or host (rank 0, which also hosts the store at ``port``) a standalone group;
    every rank must call it. A host that can let the system pick the port uses ``host_store``
    and ``group_on_store`` instead."""
    store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timedelta(seconds=timeout_s))
    return group_on_store(store, backend, rank, world_size, timeout_s, group_name)


def broadcast(group: SyncGroup, tensor: torch.Tensor, src: int = 0) -> None:
    """Broadcast one tensor in place from ``src`` over the sync group (``SyncGroup.broadcast``)."""
    group.broadcast(tensor, src)
