"""The local Ray cluster the product starts (``runtime.init_ray``) and the driver's waits on it."""

from __future__ import annotations

import ipaddress
import time

import psutil
import pytest

from selective_rollout.runtime import wait_for_coordinator

pytestmark = pytest.mark.ray


def _listeners() -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening socket of this process and its descendants
    (the GCS, raylet, dashboard pieces, agents and every worker: the whole local cluster)."""
    me = psutil.Process()
    found = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            name, conns = proc.name(), proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback  # ::ffff:127.0.0.1 is loopback too


def test_no_port_of_the_local_cluster_is_reachable_from_another_machine(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def ready(self) -> bool:
            return True

    probe = Probe.remote()  # an actor worker of our own, so worker ports are among the listeners
    assert ray.get(probe.ready.remote())
    listeners = _listeners()
    names = {name for name, _, _ in listeners}
    assert {"gcs_server", "raylet"} <= names, names  # the check sees the cluster at all
    exposed = [lst for lst in listeners if not _loopback(lst[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    ray.kill(probe)


def test_a_stalled_coordinator_stops_the_wait_with_one_clear_message(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Stalled:
        """A coordinator whose rollout never returns and whose counters never move."""

        async def rollout(self) -> None:
            import asyncio

            await asyncio.Event().wait()

        async def progress(self) -> tuple[int, int]:
            return (7, 3)

    actor = Stalled.remote()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rollout of iteration 0: the coordinator made no progress"):
        wait_for_coordinator(actor, actor.rollout.remote(), "rollout of iteration 0", stall_timeout_s=2)
    assert time.monotonic() - start < 60
    ray.kill(actor)


def test_the_wait_returns_the_result_of_a_live_coordinator(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Working:
        def __init__(self) -> None:
            self.steps = 0

        async def rollout(self) -> str:
            import asyncio

            for _ in range(6):  # longer than the stall limit, but moving all the time
                await asyncio.sleep(0.5)
                self.steps += 1
            return "batch"

        async def progress(self) -> tuple[int, int]:
            return (self.steps, self.steps)

    actor = Working.remote()
    assert wait_for_coordinator(actor, actor.rollout.remote(), "rollout", stall_timeout_s=1.0) == "batch"
    ray.kill(actor)


SIGTERM_SCRIPT = """
import os, signal, threading, time
import ray
from selective_rollout.runtime import init_ray
from selective_rollout.train import _raise_interrupt

signal.signal(signal.SIGTERM, _raise_interrupt)  # what the training CLI installs
init_ray(None, num_cpus=1)

@ray.remote(num_cpus=0)
def sleep():
    time.sleep(60)

threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
start = time.monotonic()
try:
    ray.get(sleep.remote())
    print("the wait was never interrupted")
except KeyboardInterrupt:  # the CLI's handler: RunInterrupted, re-raised by Ray as KeyboardInterrupt
    print(f"clean path after {time.monotonic() - start:.0f} s")
ray.shutdown()
"""


def test_sigterm_while_the_driver_waits_on_ray_takes_the_drivers_own_path():
    """ray.init installs sys.exit as the SIGTERM handler; the driver's must survive it."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", SIGTERM_SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert "clean path after" in out.stdout, out.stdout + out.stderr[-2000:]
