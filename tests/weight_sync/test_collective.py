"""The sync group's own mechanics: how a member waits on a transfer, and how the group is made.

Waiting is checked with stand-in transfers that finish after a set number of completion checks,
so what is asserted (how often the poll sleeps) never depends on how fast the machine is. NCCL
is not in the CPU wheel: its constructor is stood in for, to see the environment it is made in.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist

from selective_rollout.weight_sync import collective
from selective_rollout.weight_sync.collective import (
    FIRST_SLEEP_S,
    MAX_SLEEP_S,
    NCCL_ERROR_HANDLING_VAR,
    SPIN_CHECKS,
    SyncGroup,
    group_on_store,
    host_store,
    make_sync_group,
    nccl_error_handling,
)


class _Work:
    """A transfer that reports completion at its ``checks``-th ``is_completed()``."""

    def __init__(self, checks: int) -> None:
        self.left = checks

    def is_completed(self) -> bool:
        self.left -= 1
        return self.left <= 0

    def wait(self) -> bool:
        return True


class _Group:
    def __init__(self, checks: int) -> None:
        self.checks = checks

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> _Work:
        return _Work(self.checks)


class _Store:
    def check(self, keys: list[str]) -> bool:
        return False  # never called off


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(collective.time, "sleep", slept.append)
    return slept


def test_small_transfers_cost_no_sleep_however_many_there_are(sleeps: list[float]) -> None:
    """Hundreds of small tensors, each done a few checks after it was issued: a sleep per
    tensor (the poll slept before its second look) would add up over a model."""
    group = SyncGroup(_Group(checks=3), _Store(), "gloo", rank=0)
    for _ in range(500):
        group.broadcast(torch.zeros(4))
    assert sleeps == []


def test_a_long_transfer_is_looked_at_between_sleeps_growing_from_small_to_a_cap(
    sleeps: list[float],
) -> None:
    group = SyncGroup(_Group(checks=SPIN_CHECKS + 12), _Store(), "gloo", rank=0)
    group.broadcast(torch.zeros(4))
    assert len(sleeps) == 11  # the checks after the spin, less the one that saw it done
    assert sleeps[0] == FIRST_SLEEP_S and max(sleeps) == MAX_SLEEP_S
    assert sleeps == sorted(sleeps)


class _NCCL:
    """Stands for ``dist.ProcessGroupNCCL``: records the error handling it is made with."""

    made_with: ClassVar[list[str | None]] = []

    class Options:
        _timeout = None

    def __init__(self, store: dist.Store, rank: int, size: int, opts: Options) -> None:
        _NCCL.made_with.append(os.environ.get(NCCL_ERROR_HANDLING_VAR))


@pytest.mark.parametrize("before", [None, "1", "3"], ids=["unset", "teardown", "skip-cleanup"])
def test_the_nccl_sync_group_is_made_with_clean_up_only_and_the_setting_is_put_back(
    monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    """torch reads the variable per process group, when the group is made: CleanUpOnly (2) there
    lets a NCCL error or timeout fail the transfer instead of ending the process; the process's
    own value (or its absence), which DeepSpeed's and vLLM's groups are made with, is kept."""
    if before is None:
        monkeypatch.delenv(NCCL_ERROR_HANDLING_VAR, raising=False)
    else:
        monkeypatch.setenv(NCCL_ERROR_HANDLING_VAR, before)
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _NCCL, raising=False)
    monkeypatch.setattr(_NCCL, "made_with", [])
    group_on_store(host_store("127.0.0.1", 1), "nccl", 0, 1)
    assert _NCCL.made_with == ["2"]
    assert os.environ.get(NCCL_ERROR_HANDLING_VAR) == before


def test_a_gloo_sync_group_is_made_the_same_way_and_leaves_the_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both ranks are threads of this process, making their groups at once (they wait for each
    other inside): the setting holds for both and is removed when the last is made."""
    monkeypatch.delenv(NCCL_ERROR_HANDLING_VAR, raising=False)
    made_with: ClassVar[list[str | None]] = []
    gloo = dist.ProcessGroupGloo

    def recording(*args):
        made_with.append(os.environ.get(NCCL_ERROR_HANDLING_VAR))
        return gloo(*args)

    monkeypatch.setattr(dist, "ProcessGroupGloo", recording)
    store = host_store("127.0.0.1", 2)
    sent, received = torch.arange(8.0), torch.zeros(8)

    def rank(r: int) -> None:
        group = (
            group_on_store(store, "gloo", 0, 2)
            if r == 0
            else make_sync_group("gloo", "127.0.0.1", store.port, 1, 2)
        )
        group.broadcast(sent if r == 0 else received)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(rank, range(2)))
    assert made_with == ["2", "2"]
    assert NCCL_ERROR_HANDLING_VAR not in os.environ
    assert torch.equal(received, sent)


def test_the_setting_outlives_the_first_thread_to_leave_and_not_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(NCCL_ERROR_HANDLING_VAR, "1")
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with nccl_error_handling("2"):
            inside.set()
            leave.wait(timeout=30)

    thread = threading.Thread(target=other)
    with nccl_error_handling("2"):
        thread.start()
        assert inside.wait(timeout=30)
    assert os.environ[NCCL_ERROR_HANDLING_VAR] == "2"  # the other thread is still making its group
    leave.set()
    thread.join(timeout=30)
    assert os.environ[NCCL_ERROR_HANDLING_VAR] == "1"
