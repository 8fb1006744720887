"""Process-level plumbing shared by the driver, the evaluation CLI and the SFT warm start:
joining or starting Ray, turning the configured games into task streams, and the driver side's
wait on the coordinator actor (it lives here, not with the coordinator, because only the
processes that drive a run wait on it)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from selective_rollout.config import RunConfig
from selective_rollout.records import Task

log = logging.getLogger(__name__)


def init_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Join ``address`` (or ``RAY_ADDRESS``, as ``ray job submit`` sets it) or start a local
    cluster on loopback without the dashboard. Idempotent inside one process."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        with _caller_sigterm_handler_kept():
            ray.init(address=address, log_to_driver=True)
        log.info("joined Ray cluster at %s", address)
        return
    _keep_local_cluster_on_loopback()
    with _caller_sigterm_handler_kept():
        ray.init(
            address="local",  # a fresh cluster, never one another process started with `ray start`
            num_cpus=num_cpus or max(8, 4 * (os.cpu_count() or 1)),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
        )


@contextlib.contextmanager
def _caller_sigterm_handler_kept() -> Iterator[None]:
    """``ray.init`` replaces the process's SIGTERM handler with ``sys.exit``; a driver that
    installed its own (the training CLI ends a run cleanly on SIGTERM) gets it back."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(before) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, before)


def _keep_local_cluster_on_loopback() -> None:
    """Make the local cluster listen on 127.0.0.1 only.

    Ray's GCS, raylet, worker, agent and metrics servers bind to loopback exactly when the
    node's IP is 127.0.0.1, and to every interface otherwise; but ``ray.init`` rewrites a
    loopback ``_node_ip_address`` to the machine's routable address unless multi-node clusters
    are switched off (Ray's default on macOS and Windows, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``).
    A local cluster is one node by definition, so switch them off for this process and the
    cluster's processes (they inherit the environment); otherwise anyone who can reach the
    machine can run code on the training run's cluster.
    """
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time; ray was imported before this ran


def _games(cfg: RunConfig, split: str) -> list[Task]:
    """The split's tasks from the run's environment (which generates missing games where allowed)."""
    return cfg.env.build().tasks(split)


def held_out_tasks(cfg: RunConfig) -> list[Task]:
    """The first ``eval.num_tasks`` tasks of the evaluation split (a fixed, comparable set)."""
    tasks = _games(cfg, cfg.eval.split)
    return tasks[: cfg.eval.num_tasks]


def train_tasks(cfg: RunConfig) -> list[Task]:
    return _games(cfg, "train")


def task_stream(tasks: list[Task], seed: int, start: int = 0) -> Iterator[Task]:
    """An endless stream of the tasks, reshuffled each epoch by ``seed``: every arm of an
    experiment with the same seed sees the same tasks in the same order."""
    if not tasks:
        raise ValueError("the task list is empty")
    position, epoch = 0, 0
    while True:
        order = list(tasks)
        random.Random(seed * 100_003 + epoch).shuffle(order)
        for task in order:
            if position >= start:
                yield task
            position += 1
        epoch += 1


PROBE_S = 30.0


def wait_for_coordinator(
    coordinator: Any,
    ref: Any,
    what: str,
    stall_timeout_s: float,
    on_probe: Callable[[], None] | None = None,
) -> Any:
    """``ray.get(ref)`` that cannot wait forever: it polls the coordinator's progress and stops
    with one clear message when nothing moved (no generated token, no env step) for
    ``stall_timeout_s``, or when the coordinator stops answering. A dead coordinator already
    surfaces as the ref's own error. ``on_probe`` runs at every poll (the driver replaces dead
    engines there)."""
    import ray
    from ray.exceptions import GetTimeoutError

    last, still = None, 0.0
    while True:
        ready, _ = ray.wait([ref], timeout=min(PROBE_S, stall_timeout_s))
        if ready:
            return ray.get(ref)
        if on_probe is not None:
            on_probe()
        try:
            progress = ray.get(coordinator.progress.remote(), timeout=PROBE_S)
        except GetTimeoutError:
            progress = None
        if progress is not None and progress != last:
            last, still = progress, 0.0
            continue
        still += min(PROBE_S, stall_timeout_s)
        if still >= stall_timeout_s:
            state = "does not answer" if progress is None else "made no progress (no token, no env step)"
            raise RuntimeError(
                f"{what}: the coordinator {state} for {still:.0f} s; stopping instead of waiting forever "
                "(its log: the CoordinatorActor lines above, or /tmp/ray/session_latest/logs; the limit "
                "is driver.stall_timeout_s)"
            )
