"""``make install-gpu`` builds its own venv with torch's CUDA build and refuses a CPU one.

In ``make install``'s .venv, torch 2.13.0+cpu satisfies ``torch==2.13.0`` (PEP 440 ignores the
local label), so the GPU set must not go there. No GPU or network here: the make recipe is read
with ``make -n``, and the check runs against this venv's own CPU torch.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from launch.check_torch_build import cpu_build_error

REPO = Path(__file__).resolve().parents[2]
GPU_PY = ".venv-gpu/bin/python"


def make_dry_run(target: str) -> list[list[str]]:
    """The commands ``make target`` would run from scratch, each split into its words. Run as a
    make of its own: under ``make test`` the parent's MAKEFLAGS and MAKELEVEL would make it a
    sub-make, which prints "make[1]: Entering directory" lines among the commands."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [shlex.split(line) for line in done.stdout.splitlines() if line.strip()]


def dev_pins(*names: str) -> list[str]:
    """The dev extra's exact pins of ``names``, as pyproject.toml writes them."""
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return [spec for spec in dev if spec.split("==")[0] in names]


def test_the_cpu_torch_of_this_venv_is_refused_with_one_line() -> None:
    if torch.version.cuda is not None:
        pytest.skip(f"torch {torch.__version__} is a CUDA build: there is no CPU build here to refuse")
    prefix = Path(sys.prefix)
    if not prefix.is_relative_to(REPO):
        pytest.skip(f"the venv {prefix} is not the project's")
    done = subprocess.run(
        [sys.executable, "launch/check_torch_build.py"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    venv = prefix.relative_to(REPO)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"install-gpu: {venv} has torch {torch.__version__}, a CPU build; "
        f"remove {venv} and run make install-gpu on a node with CUDA"
    ]


def test_a_cuda_build_passes_the_check() -> None:
    assert cpu_build_error("2.13.0", "13.0", ".venv-gpu") is None
    assert cpu_build_error("2.13.0+cpu", None, ".venv-gpu").startswith("install-gpu: .venv-gpu has torch")


def test_install_gpu_builds_its_own_venv_with_the_cuda_torch_checked_first() -> None:
    commands = make_dry_run("install-gpu")
    assert not any(".venv/" in word for command in commands for word in command), commands
    pips = [c for c in commands if c[:4] == [GPU_PY, "-m", "pip", "install"]]
    (torch_install,) = [c for c in pips if "torch==2.13.0" in c]
    assert not any("index-url" in word for word in torch_install), "torch must come from PyPI (CUDA build)"
    (extra,) = [c for c in pips if ".[gpu]" in c]
    assert set(dev_pins("pytest", "pytest-timeout")) <= set(extra), extra
    assert len(dev_pins("pytest", "pytest-timeout")) == 2
    order = [commands.index(c) for c in (torch_install, [GPU_PY, "launch/check_torch_build.py"], extra)]
    assert order == sorted(order), "the check runs after torch's install and before the gpu extra's"
    assert commands[-1] == ["touch", ".venv-gpu/.installed-gpu"]


def test_the_cluster_smoke_runs_in_the_gpu_venv_after_its_install() -> None:
    commands = make_dry_run("gpu-smoke-cluster")
    assert ["touch", ".venv-gpu/.installed-gpu"] in commands
    assert commands[-1] == [GPU_PY, "bench/gpu_smoke_cluster.py"]
