"""This process's resident memory, and the allocator that keeps it close to what it holds.

Why: on CPU the rollout engine and the learner allocate tensors of ever-different shapes
(prompts, KV caches, decode batches and packed micro-batches of every length), and glibc's
allocator keeps much of what they free: a CPU engine holding 0.2-0.7 GB of session KV reached
8-9 GB resident in two minutes of rollout traffic (``bench/engine_memory.py``), and over a long
run the engine and the learner grew to ~10 GB each until Ray's out-of-memory killer ended the run.
jemalloc hands freed memory back by itself; Ray's wheel ships a copy, so every node that runs Ray
has one (``placement.allocator``). The driver logs every actor's resident memory each iteration
(``system/rss_gb/*``), so growth shows in the metrics before a worker is killed.
"""

from __future__ import annotations

from pathlib import Path

GB = 1e9


def resident_bytes() -> int:
    """Resident set size of this process (what the OS and Ray's memory monitor count)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def resident_gb() -> float:
    """``resident_bytes`` in GB: what every actor's ``resident_gb`` reports (``system/rss_gb/*``)."""
    return resident_bytes() / GB


def jemalloc_library() -> Path | None:
    """The jemalloc that Ray's wheel ships (``ray/core/libjemalloc.so``); None where it has none."""
    import ray

    path = Path(ray.__file__).parent / "core" / "libjemalloc.so"
    return path if path.is_file() else None
