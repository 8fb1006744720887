"""The ports rank 0 names to the other members are held from the moment they are named.

A port found free, closed and handed on can be taken by any process before the store that should
listen there is made; rank 0 instead opens its store on a port the system picks and keeps it
until the world (or the sync group) is built on it.
"""

from __future__ import annotations

import errno
import socket
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from selective_rollout.learner.learner import LearnerWorker
from selective_rollout.weight_sync.collective import make_sync_group


@pytest.fixture
def rank0(monkeypatch: pytest.MonkeyPatch) -> LearnerWorker:
    """Rank 0 of two learners, without a model (only its rendezvous is used)."""
    import ray

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    worker = object.__new__(LearnerWorker)
    worker.rank, worker.world_size = 0, 2
    worker._world_store = worker._sync_store = None
    return worker


def _taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def test_the_learners_world_port_is_held_by_rank_0s_store_once_named(rank0: LearnerWorker) -> None:
    host, port = rank0.rendezvous_address()
    assert _taken(port)
    client = dist.TCPStore(host, port, 2, is_master=False, timeout=timedelta(seconds=30))
    client.set("rank 1", "here")  # the store that holds it is the world's rendezvous
    assert rank0._world_store.get("rank 1") == b"here"


def test_the_sync_groups_port_is_held_until_the_group_is_built_on_it(rank0: LearnerWorker) -> None:
    host, port = rank0.open_sync_store(2)
    assert _taken(port)
    received = torch.zeros(4)

    def engine() -> None:
        make_sync_group("gloo", host, port, 1, 2).broadcast(received)

    thread = threading.Thread(target=engine)
    thread.start()
    rank0.init_sync_group(2, "gloo")
    rank0.sync_pg.broadcast(torch.arange(4.0))
    thread.join(timeout=60)
    assert torch.equal(received, torch.arange(4.0))
