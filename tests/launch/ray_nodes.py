"""Ray nodes as subprocesses of the test (``ray start --block``), ended by PID, never ``ray stop``.

``ray stop`` kills every Ray process on the machine by name, including the other engineers'
test clusters; a ``--block``ed ``ray start`` instead tears down exactly the processes it started
when it receives SIGTERM. Every port is picked free and bound to loopback so that two of these
nodes (and anyone else's local Ray) coexist on one machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free right now on loopback (sockets held until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_env() -> dict[str, str]:
    """The node's environment: this interpreter's bin first on PATH, so a job's ``python`` is ours."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # set by init_ray's loopback-only local cluster
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


@dataclass
class RayNode:
    """One ``ray start --block`` process and what it spawned."""

    proc: subprocess.Popen
    log_path: Path
    gcs_address: str
    dashboard_url: str | None = None
    descendants: list[psutil.Process] = field(default_factory=list)
    temp_dir: Path | None = None  # the node's own session root, removed after it stops

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def remember_descendants(self) -> None:
        """Record the process tree now (gcs, raylet, dashboard, workers) to check it is gone later."""
        known = {p.pid for p in self.descendants}
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            if child.pid not in known:
                self.descendants.append(child)

    def stop(self, grace_s: float = 30.0) -> list[str]:
        """SIGTERM the ``ray start`` process, SIGKILL it after ``grace_s``; return survivors.

        Survivors (processes of this tree still alive after another ``grace_s``) are killed by PID
        so that a failing test leaves nothing behind, and returned so that the test can fail.
        """
        if self.proc.poll() is None:
            self.remember_descendants()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace_s)
        _, alive = psutil.wait_procs(self.descendants, timeout=grace_s)
        survivors = []
        for p in alive:
            try:
                survivors.append(f"{p.pid} {p.name()}")
                p.kill()
            except psutil.NoSuchProcess:
                continue
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return survivors


def _start(args: list[str], log_path: Path) -> subprocess.Popen:
    log = log_path.open("w")
    return subprocess.Popen(
        [RAY, "start", "--block", "--disable-usage-stats", f"--node-ip-address={LOOPBACK}", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=node_env(),
        start_new_session=True,
    )


def _node_ports() -> list[str]:
    om, nm, agent_http, agent_grpc, metrics, runtime_env = free_ports(6)
    return [
        f"--object-manager-port={om}",
        f"--node-manager-port={nm}",
        f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}",
    ]


def _wait_http(url: str, node: RayNode, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {node.proc.returncode}:\n{node.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s:\n{node.log_tail()}")


def start_head(log_dir: Path, num_cpus: int = 2, timeout_s: float = 180.0) -> RayNode:
    """A head with the dashboard (job submission needs it) on free loopback ports."""
    gcs, dashboard, client = free_ports(3)
    proc = _start(
        [
            "--head",
            f"--port={gcs}",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=true",
            f"--dashboard-host={LOOPBACK}",
            f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={client}",
            *_node_ports(),
        ],
        log_dir / "head.log",
    )
    node = RayNode(proc, log_dir / "head.log", f"{LOOPBACK}:{gcs}", f"http://{LOOPBACK}:{dashboard}")
    try:
        _wait_http(f"{node.dashboard_url}/api/version", node, timeout_s)
    except BaseException:
        node.stop()
        raise
    node.remember_descendants()
    return node


def start_worker(head: RayNode, log_dir: Path, resources: dict[str, float], num_cpus: int = 2) -> RayNode:
    """A second node joining ``head`` with its own custom ``resources`` (same machine, loopback).

    It gets its own temp dir, as a node on another machine has: nodes sharing one session folder
    share ``runtime_resources/``, and Ray's working-dir set-up on one node deletes and unpacks
    again the folder a job driver on the other runs from (its later imports then fail)."""
    log_path = log_dir / "worker.log"
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-node-", dir="/tmp"))  # short: socket paths
    proc = _start(
        [
            f"--address={head.gcs_address}",
            f"--temp-dir={temp_dir}",
            f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}",
            *_node_ports(),
        ],
        log_path,
    )
    node = RayNode(proc, log_path, head.gcs_address, temp_dir=temp_dir)
    node.remember_descendants()
    return node


def wait_for_nodes(head: RayNode, count: int, timeout_s: float = 120.0) -> list:
    """Poll the state API (over the dashboard, no ``ray.init``) until ``count`` nodes are alive."""
    from ray.util.state import list_nodes

    deadline = time.monotonic() + timeout_s
    alive: list = []
    while time.monotonic() < deadline:
        alive = list_nodes(address=head.dashboard_url, filters=[("state", "=", "ALIVE")])
        if len(alive) >= count:
            return alive
        time.sleep(2.0)
    raise TimeoutError(f"{len(alive)} of {count} Ray nodes alive after {timeout_s} s:\n{head.log_tail()}")


def submit(dashboard_url: str, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """Run ``launch/submit.py`` from the repository root, as a user would, against ``dashboard_url``."""
    return subprocess.run(
        [sys.executable, str(REPO / "launch" / "submit.py"), "--address", dashboard_url, *args],
        cwd=REPO,
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@contextlib.contextmanager
def head_and_worker(
    log_dir: Path, head_cpus: int, worker_resources: dict[str, float], worker_cpus: int
) -> Iterator[tuple[RayNode, dict[str, str]]]:
    """A head and a second node offering ``worker_resources``: (head, {"head": node id, "worker":
    node id}). Both are stopped by PID on exit, and processes that outlive them fail the caller."""
    head = start_head(log_dir, num_cpus=head_cpus)
    worker = None
    try:
        worker = start_worker(head, log_dir, worker_resources, num_cpus=worker_cpus)
        nodes = wait_for_nodes(head, 2)
        marker = next(iter(worker_resources))
        yield (
            head,
            {
                "head": next(n.node_id for n in nodes if n.is_head_node),
                "worker": next(n.node_id for n in nodes if n.resources_total.get(marker)),
            },
        )
    finally:
        survivors = (worker.stop() if worker else []) + head.stop()
    assert survivors == [], f"Ray processes outlived their nodes: {survivors}"
