"""The vLLM worker receives broadcast weights one tensor at a time, as its loader asks.

The worker extension needs no vLLM to test: a stand-in worker (vLLM's ``reload_weights`` and
``model_runner.get_model()``) records what the loader saw, how many received tensors were alive
at once, and whether a stopped reload was closed, over a real gloo group on loopback. vLLM's own
reload is tested in tests/vllm.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from types import SimpleNamespace

import pytest
import torch

from selective_rollout.trainer.learner import free_port
from selective_rollout.weight_sync.collective import (
    SyncAborted,
    TensorSpec,
    broadcast,
    call_off,
    make_sync_group,
)
from selective_rollout.weight_sync.vllm_worker import WeightSyncExtension, pack_specs

WEIGHTS = {f"layer{i}.weight": torch.full((64, 64), float(i)) for i in range(6)}


class _Worker(WeightSyncExtension):
    device = torch.device("cpu")

    def __init__(self, stop_after: int | None = None) -> None:
        self.loaded: dict[str, torch.Tensor] = {}
        self.peak_alive = 0
        alive: weakref.WeakSet = weakref.WeakSet()

        def load_weights(weights):
            for name, tensor in weights:
                alive.add(tensor)
                gc.collect()
                self.peak_alive = max(self.peak_alive, len(alive))
                self.loaded[name] = tensor.clone()
                if stop_after is not None and len(self.loaded) >= stop_after:
                    return  # a loader that stops early (e.g. it only wanted some names)

        self._load = load_weights
        self.closed_reloads = 0
        model = torch.nn.Linear(2, 2)  # no tied layers: nothing to process again after a load
        self.model_runner = SimpleNamespace(get_model=lambda: model)

    def reload_weights(self, weights_iterator, is_checkpoint_format: bool) -> None:
        assert is_checkpoint_format  # HF names: vLLM's loaders fuse qkv and gate/up themselves
        self._load(weights_iterator)

    def _sr_close_reload(self) -> None:
        self.closed_reloads += 1


def _sync(worker: _Worker) -> None:
    port = free_port("127.0.0.1")
    specs = [TensorSpec.of(n, t) for n, t in WEIGHTS.items()]

    def learner() -> None:
        group = make_sync_group("gloo", "127.0.0.1", port, 0, 2)
        for spec in specs:
            broadcast(group, WEIGHTS[spec.name].clone(), src=0)

    sender = threading.Thread(target=learner, daemon=True)
    sender.start()
    worker.sr_init_weight_sync("127.0.0.1", port, 1, 2, "gloo")
    worker.sr_receive_weights(pack_specs(specs))
    sender.join(timeout=30)
    assert not sender.is_alive(), "the learner is still waiting on a broadcast"


def test_weights_are_received_as_the_loader_asks_not_all_at_once():
    worker = _Worker()
    _sync(worker)
    assert list(worker.loaded) == list(WEIGHTS)
    assert all(torch.equal(worker.loaded[n], t) for n, t in WEIGHTS.items())
    assert worker.peak_alive <= 2  # the tensor being loaded and the one before it: not the model


def test_tensors_the_loader_never_asks_for_are_still_received():
    worker = _Worker(stop_after=1)  # rank 0 broadcasts all six: the worker must take all six
    _sync(worker)
    assert list(worker.loaded) == ["layer0.weight"]


def test_a_sync_called_off_midway_frees_the_worker_at_once():
    """The learner sends two of six tensors and stops (it is stuck, or a peer died): the worker,
    waiting on the third, gives up as soon as the driver calls the sync off, not after 300 s."""
    port = free_port("127.0.0.1")
    specs = [TensorSpec.of(n, t) for n, t in WEIGHTS.items()]
    learner_group: list = []

    def learner() -> None:
        group = make_sync_group("gloo", "127.0.0.1", port, 0, 2)
        learner_group.append(group)  # hosts the store: it must outlive the worker's wait
        for spec in specs[:2]:
            broadcast(group, WEIGHTS[spec.name].clone(), src=0)

    def driver() -> None:
        time.sleep(1.0)
        assert call_off("127.0.0.1", port, "engine 3 died")

    sender = threading.Thread(target=learner, daemon=True)
    sender.start()
    worker = _Worker()
    worker.sr_init_weight_sync("127.0.0.1", port, 1, 2, "gloo")
    threading.Thread(target=driver, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(SyncAborted, match="engine 3 died"):
        worker.sr_receive_weights(pack_specs(specs))
    assert time.monotonic() - start < 30
    assert list(worker.loaded) == ["layer0.weight", "layer1.weight"]  # partly loaded until the next sync
    assert worker.closed_reloads == 1  # the stopped reload is closed before the error leaves
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
        worker = object.__new__(_Worker)
        worker.rank = rank
        model = torch.nn.Module()
        model.shard = sharded[rank]
        model.norm = torch.nn.Parameter(norm.clone())
        worker.model_runner = SimpleNamespace(model=model)
        workers.append(worker)
    assert sum(w.sr_checksum() for w in workers) == pytest.approx(4 * 8 * (1 + 2) + 8 * 0.5)
