"""Stand-ins for the vLLM side of a weight sync, so the worker extension and the engine's calls
into it run without vLLM: a worker (``WorkerDouble``) and the way replies come back from a
tensor-parallel engine's workers (``ReplyQueueEngine``)."""

from __future__ import annotations

import asyncio
import gc
import queue
import weakref
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import torch

from selective_rollout.weight_sync.vllm_worker import WeightSyncExtension


class WorkerDouble(WeightSyncExtension):
    """A vLLM worker as the extension sees it (``reload_weights``, ``model_runner.get_model()``,
    ``rank``): it records what the loader saw, how many received tensors were alive at once, and
    whether a stopped reload was closed. ``stop_after``: a loader that stops asking after that
    many tensors; ``fail_at``: a loader that raises on that tensor's name."""

    device = torch.device("cpu")

    def __init__(self, rank: int = 0, stop_after: int | None = None, fail_at: str | None = None) -> None:
        self.rank = rank
        self.loaded: dict[str, torch.Tensor] = {}
        self.peak_alive = 0
        self.stop_after, self.fail_at = stop_after, fail_at
        self.closed_reloads = 0
        model = torch.nn.Linear(2, 2)  # no tied layers: nothing to process again after a load
        self.model_runner = SimpleNamespace(get_model=lambda: model)

    def reload_weights(self, weights_iterator, is_checkpoint_format: bool) -> None:
        assert is_checkpoint_format  # HF names: vLLM's loaders fuse qkv and gate/up themselves
        alive: weakref.WeakSet = weakref.WeakSet()
        for name, tensor in weights_iterator:
            if name == self.fail_at:
                raise KeyError(f"{name} is not a weight of this model")
            alive.add(tensor)
            gc.collect()
            self.peak_alive = max(self.peak_alive, len(alive))
            self.loaded[name] = tensor.clone()
            if self.stop_after is not None and len(self.loaded) >= self.stop_after:
                return  # a loader that stops early (e.g. it only wanted some names)

    def _sr_close_reload(self) -> None:
        self.closed_reloads += 1


class ReplyQueueEngine:
    """``AsyncLLM`` as far as ``collective_rpc`` replies go, reproduced from vLLM 0.32's multiproc
    executor (vllm/v1/executor/multiproc_executor.py).

    Each worker runs the calls it is sent one after another and queues one reply per call: the
    method's value, or a failure carrying the text of what it raised
    (``WorkerProc._execute_worker_rpc``). A call reads one reply per worker in rank order and
    raises at the first failure, leaving the later workers' replies queued, where the next call
    reads them (``MultiprocExecutor.collective_rpc``)."""

    def __init__(self, workers: list[WeightSyncExtension]) -> None:
        self.workers = workers
        self.paused: tuple[str, bool] | None = None
        self.replies: list[queue.Queue] = [queue.Queue() for _ in workers]
        self._processes = [ThreadPoolExecutor(1) for _ in workers]  # one call at a time per worker

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        for worker, process, replies in zip(self.workers, self._processes, self.replies, strict=True):
            process.submit(_run, getattr(worker, method), args, replies)
        return await asyncio.to_thread(self._read)

    def _read(self) -> list[Any]:
        out = []
        for replies in self.replies:
            ok, value = replies.get(timeout=120)
            if not ok:
                raise RuntimeError(f"Worker failed with error '{value}', please check the stack trace above")
            out.append(value)
        return out

    async def reset_prefix_cache(self) -> bool:
        return True

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        """What a weight load holds the scheduler with; recorded, so a test sees it let go."""
        self.paused = (mode, clear_cache)

    async def resume_generation(self) -> None:
        self.paused = None

    def unread(self) -> list[int]:
        """Each worker's replies nobody read, once every worker has finished what it was sent."""
        for process in self._processes:
            process.submit(lambda: None).result(timeout=120)
        return [replies.qsize() for replies in self.replies]

    def close(self) -> None:
        for process in self._processes:
            process.shutdown(wait=False, cancel_futures=True)


def _run(method, args: tuple, replies: queue.Queue) -> None:
    try:
        replies.put((True, method(*args)))
    except Exception as exc:
        replies.put((False, str(exc)))
