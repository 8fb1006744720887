"""The vLLM worker receives broadcast weights one tensor at a time, as its loader asks.

The worker extension needs no vLLM to test: a stand-in worker (vLLM's ``reload_weights`` and
``model_runner.get_model()``) records what the loader saw, how many received tensors were alive
at once, and whether a stopped reload was closed, over a real gloo group on loopback. vLLM's own
reload is tested in tests/vllm.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from selective_rollout.weight_sync.collective import (
    TensorSpec,
    broadcast,
    call_off,
    group_on_store,
    host_store,
)
from selective_rollout.weight_sync.vllm_worker import pack_specs
from tests.weight_sync.vllm_double import WorkerDouble

WEIGHTS = {f"layer{i}.weight": torch.full((64, 64), float(i)) for i in range(6)}


def _sync(worker: WorkerDouble) -> tuple[bool, object]:
    store = host_store("127.0.0.1", 2)
    specs = [TensorSpec.of(n, t) for n, t in WEIGHTS.items()]

    def learner() -> None:
        group = group_on_store(store, "gloo", 0, 2)
        for spec in specs:
            broadcast(group, WEIGHTS[spec.name].clone(), src=0)

    sender = threading.Thread(target=learner, daemon=True)
    sender.start()
    assert worker.sr_init_weight_sync("127.0.0.1", store.port, 1, 2, "gloo") == (True, None)
    reply = worker.sr_receive_weights(pack_specs(specs))
    sender.join(timeout=30)
    assert not sender.is_alive(), "the learner is still waiting on a broadcast"
    return reply


def test_weights_are_received_as_the_loader_asks_not_all_at_once():
    worker = WorkerDouble()
    assert _sync(worker) == (True, None)
    assert list(worker.loaded) == list(WEIGHTS)
    assert all(torch.equal(worker.loaded[n], t) for n, t in WEIGHTS.items())
    assert worker.peak_alive <= 2  # the tensor being loaded and the one before it: not the model


def test_tensors_the_loader_never_asks_for_are_still_received():
    worker = WorkerDouble(stop_after=1)  # rank 0 broadcasts all six: the worker must take all six
    assert _sync(worker) == (True, None)
    assert list(worker.loaded) == ["layer0.weight"]


def test_a_sync_called_off_midway_frees_the_worker_at_once():
    """The learner sends two of six tensors and stops (it is stuck, or a peer died): the worker,
    waiting on the third, gives up as soon as the driver calls the sync off, not after 300 s,
    and says so in its reply (it raises nothing across vLLM's RPC)."""
    store = host_store("127.0.0.1", 2)
    specs = [TensorSpec.of(n, t) for n, t in WEIGHTS.items()]
    learner_group: list = []

    def learner() -> None:
        group = group_on_store(store, "gloo", 0, 2)
        learner_group.append(group)  # its connections must outlive the worker's wait
        for spec in specs[:2]:
            broadcast(group, WEIGHTS[spec.name].clone(), src=0)

    def driver() -> None:
        time.sleep(1.0)
        assert call_off("127.0.0.1", store.port, "engine 3 died")

    sender = threading.Thread(target=learner, daemon=True)
    sender.start()
    worker = WorkerDouble()
    worker.sr_init_weight_sync("127.0.0.1", store.port, 1, 2, "gloo")
    threading.Thread(target=driver, daemon=True).start()
    start = time.monotonic()
    ok, reason = worker.sr_receive_weights(pack_specs(specs))
    assert not ok and reason.startswith("SyncAborted: ") and "engine 3 died" in reason
    assert time.monotonic() - start < 30
    assert list(worker.loaded) == ["layer0.weight", "layer1.weight"]  # partly loaded until the next sync
    assert worker.closed_reloads == 1  # the stopped reload is closed before the reply leaves
    assert worker._sr_group is None  # the group is abandoned: the next sync rebuilds it
    sender.join(timeout=30)


def test_the_checksum_counts_replicated_tensors_once_across_tensor_parallel_workers():
    """Two workers of one TP=2 engine: each holds half of a sharded weight (vLLM marks it with an
    output dim) and a whole copy of a replicated norm; the engine adds their sums."""
    sharded = [torch.nn.Parameter(torch.full((4, 8), float(r + 1))) for r in range(2)]
    for p in sharded:
        p.output_dim = 0
    norm = torch.full((8,), 0.5)
    workers = []
    for rank in range(2):
        worker = WorkerDouble(rank)
        model = torch.nn.Module()
        model.shard = sharded[rank]
        model.norm = torch.nn.Parameter(norm.clone())
        worker.model_runner = SimpleNamespace(model=model)
        workers.append(worker)
    sums = [w.sr_checksum() for w in workers]
    assert all(ok for ok, _ in sums)
    assert sum(value for _, value in sums) == pytest.approx(4 * 8 * (1 + 2) + 8 * 0.5)
