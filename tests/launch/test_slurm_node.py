"""What each SLURM node's Ray gets from ``launch/slurm_ray.sbatch``: its CPUs and the head's address.

No SLURM here: the script is read for its ``srun`` steps, and its address pick runs under bash
with a fake ``hostname`` on PATH.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

SBATCH = Path(__file__).resolve().parents[2] / "launch" / "slurm_ray.sbatch"


def commands() -> list[list[str]]:
    """The script's commands, continuation lines joined, each split into its words."""
    text = SBATCH.read_text().replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.strip()]


def test_every_ray_start_step_names_the_cpus_its_ray_offers() -> None:
    """Since Slurm 22.05 srun does not inherit the job's --cpus-per-task: a step without it gets one
    CPU, and Ray's --num-cpus would promise CPUs the step's cgroup does not have."""
    steps = [c for c in commands() if c and c[0] == "srun" and "ray" in c and "start" in c]
    assert len(steps) == 3, steps
    for step in steps:
        options = dict(word.split("=", 1) for word in step if word.startswith("--") and "=" in word)
        assert options.get("--cpus-per-task") == options["--num-cpus"], step


def node_address_function() -> str:
    match = re.search(r"^node_address\(\) \{\n.*?^\}\n", SBATCH.read_text(), re.M | re.S)
    assert match, "slurm_ray.sbatch: node_address() not found"
    return match.group(0)


def node_address(tmp_path: Path, addresses: str) -> subprocess.CompletedProcess:
    """Run the script's node_address where ``hostname -I`` prints ``addresses``."""
    fake = tmp_path / "hostname"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = -I ]; then echo "{addresses}"; else echo gpu-node-1; fi\n')
    fake.chmod(0o755)
    return subprocess.run(
        ["bash", "-c", f"{node_address_function()}node_address"],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("addresses", "picked"),
    [
        ("10.0.3.17 172.17.0.1", "10.0.3.17"),
        ("127.0.1.1 10.0.3.17", "10.0.3.17"),
        ("fe80::1c2:3ff:fe4d:5e6f 192.168.8.4", "192.168.8.4"),
    ],
)
def test_the_head_address_is_the_first_ipv4_outside_loopback(tmp_path: Path, addresses, picked) -> None:
    done = node_address(tmp_path, addresses)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{picked}\n", "")


@pytest.mark.parametrize("addresses", ["127.0.1.1", "127.0.0.1 ::1", ""])
def test_a_node_with_only_loopback_is_refused_in_one_line(tmp_path: Path, addresses: str) -> None:
    done = node_address(tmp_path, addresses)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpu-node-1: no IPv4 address outside loopback") and "SR_HEAD_IP" in line


def test_the_head_address_comes_from_node_address_on_the_head() -> None:
    """The batch step may run elsewhere than the head: the pick runs on the head through srun
    (``hostname --ip-address`` may answer 127.0.1.1)."""
    (assignment,) = [c for c in commands() if c and c[0].startswith("HEAD_IP=")]
    assert "srun" in assignment[0] and "node_address" in assignment[-1], assignment
    assert not any("--ip-address" in word for command in commands() for word in command)
