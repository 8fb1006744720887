"""This process's resident memory, and the allocator that keeps it close to what it holds.

Why: on CPU the rollout engine and the learner allocate tensors of ever-different shapes
(prompts, KV caches, decode batches and packed micro-batches of every length), and glibc's
allocator keeps much of what they free: a CPU engine holding 0.2-0.7 GB of session KV reached
8-9 GB resident in two minutes of rollout traffic (``bench/engine_memory.py``), and over a long
run the engine and the learner grew to ~10 GB each until Ray's out-of-memory killer ended the run.
jemalloc hands freed memory back by itself; Ray's Linux wheels ship a copy, so every such node
that runs Ray has one (``placement.*_allocator``; the learner runs on it by default). The driver
logs every actor's resident memory each iteration (``system/rss_gb/*``), so growth shows in the
metrics before a worker is killed.

Work that runs once in a long-lived process and allocates gigabytes (the warm start's fine-tuning
in the driver) runs in a fresh process instead (``in_fresh_process``): whatever the allocator,
its memory goes back to the OS when that process ends, not at the end of the run.

``here`` says where the calling process runs (Ray node, pid, allocator): what every actor reports
for ``placement.json``, kept here, below the config, so that the engine contract can ask it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

GB = 1e9
T = TypeVar("T")


def resident_bytes() -> int:
    """Resident set size of this process (what the OS and Ray's memory monitor count)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def resident_gb() -> float:
    """``resident_bytes`` in GB: what every actor's ``resident_gb`` reports (``system/rss_gb/*``)."""
    return resident_bytes() / GB


def malloc_in_use() -> str:
    """``jemalloc`` when a jemalloc is mapped into this process (``placement.*_allocator``), else
    ``system``; read from ``/proc/self/maps``, so it says what the process got, not what was asked."""
    maps = Path("/proc/self/maps")
    if not maps.is_file():  # not Linux: nothing was preloaded
        return "system"
    with maps.open() as lines:
        return "jemalloc" if any("jemalloc" in line.rsplit(None, 1)[-1] for line in lines) else "system"


def jemalloc_library() -> Path | None:
    """The jemalloc that Ray's wheel ships (``ray/core/libjemalloc.so``); None where it has none."""
    import ray

    path = Path(ray.__file__).parent / "core" / "libjemalloc.so"
    return path if path.is_file() else None


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh (spawned) process, its result returned here and its exception raised
    here; its log records go to this process's handlers, so it logs as if it ran here. ``fn`` and
    ``args`` must pickle (a module-level function, configs, paths)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from logging.handlers import QueueListener

    context = multiprocessing.get_context("spawn")
    records = context.Queue()
    root = logging.getLogger()
    listener = QueueListener(records, *(root.handlers or [logging.lastResort]), respect_handler_level=True)
    listener.start()
    try:
        with ProcessPoolExecutor(
            1, mp_context=context, initializer=_log_to_queue, initargs=(records, root.getEffectiveLevel())
        ) as pool:
            return pool.submit(fn, *args).result()
    except BrokenProcessPool as exc:
        raise RuntimeError(
            f"{getattr(fn, '__name__', fn)}: its process ended without an answer (killed, e.g. out of memory)"
        ) from exc
    finally:
        listener.stop()


def _log_to_queue(records: Any, level: int) -> None:
    """In the fresh process: every log record goes to the parent's queue (``in_fresh_process``)."""
    from logging.handlers import QueueHandler

    root = logging.getLogger()
    root.handlers[:] = [QueueHandler(records)]
    root.setLevel(level)


Location = dict[str, Any]  # a process's node, pid and allocator (placement.json)


def here() -> Location:
    """The Ray node, process and malloc of the caller (an actor method calls this on itself)."""
    import ray

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "malloc": malloc_in_use(),
    }
