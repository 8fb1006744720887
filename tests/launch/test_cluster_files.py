"""The cluster files (ray up, KubeRay, SLURM) are well-formed and agree with the package.

No cloud, Kubernetes or SLURM here: the ray up file is checked against the cluster launcher's
own JSON schema, the RayJob against what KubeRay needs from it, the sbatch script by bash's
parser, and all three for the run they launch (config file, driver arguments, placement).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml

from selective_rollout.config import load_config

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
IMAGE_ROOT = "/opt/selective-rollout/"  # WORKDIR of docker/Dockerfile
ENV_RESOURCE = "env_node"


def ray_pin() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==")[1] for d in deps if d.startswith("ray[default]=="))


def kuberay_driver_args() -> list[str]:
    job = yaml.safe_load((LAUNCH / "kuberay_rayjob.yaml").read_text())
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "selective_rollout.train"], argv
    return [a.removeprefix(IMAGE_ROOT) for a in argv[3:]]


def slurm_driver_args() -> list[str]:
    text = (LAUNCH / "slurm_ray.sbatch").read_text()
    block = re.search(r"DRIVER_ARGS=\((--config.*?)\)\nfi", text, re.S)
    assert block, "slurm_ray.sbatch: default DRIVER_ARGS=(--config ...) not found"
    return shlex.split(block.group(1).replace("$SLURM_SUBMIT_DIR", "/shared"))


def ray_up_driver_args() -> list[str]:
    text = (LAUNCH / "ray_cluster.yaml").read_text()
    block = re.search(r"submit\.py -- \\\n((?:#.*\n)+?)#\s+ray down", text)
    assert block, "ray_cluster.yaml: the submit example is missing"
    lines = [line.lstrip("#").strip().rstrip("\\") for line in block.group(1).splitlines()]
    return shlex.split(" ".join(lines))


LAUNCHERS = {"kuberay": kuberay_driver_args, "slurm": slurm_driver_args, "ray_up": ray_up_driver_args}


def split_driver_args(argv: list[str]) -> tuple[Path, list[str]]:
    assert argv[0] == "--config", argv
    return REPO / argv[1], argv[2:]


def test_ray_up_file_passes_the_cluster_launcher_schema() -> None:
    config = yaml.safe_load((LAUNCH / "ray_cluster.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    assert sum(t.get("min_workers", 0) for t in types.values()) <= config["max_workers"]
    env_types = [t for t in types.values() if t["resources"].get(ENV_RESOURCE)]
    gpu_types = [t for t in types.values() if t["resources"].get("GPU")]
    assert env_types and all(not t["resources"].get("GPU") for t in env_types)
    assert types[config["head_node_type"]] in gpu_types


def test_rayjob_matches_the_package_and_places_env_workers_on_cpu_pods() -> None:
    job = yaml.safe_load((LAUNCH / "kuberay_rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == ray_pin()
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    env_groups = []
    for name, group in groups.items():
        start = group["rayStartParams"]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        if "resources" in start:
            custom = json.loads(json.loads(start["resources"]))  # KubeRay wants a quoted JSON string
            assert custom.get(ENV_RESOURCE), name
            assert "nvidia.com/gpu" not in limits, f"env group {name} holds GPUs"
            env_groups.append(name)
        else:
            assert int(limits["nvidia.com/gpu"]) > 0, name
    assert env_groups
    head_limits = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(head_limits["nvidia.com/gpu"]) > 0


def test_sbatch_script_parses_and_starts_blocking_nodes() -> None:
    script = LAUNCH / "slurm_ray.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    starts = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ray start")]
    assert len(starts) == 3 and all("--block" in ln for ln in starts), starts
    assert "ray stop" not in text
    assert f'--resources="{{\\"{ENV_RESOURCE}\\"' in text
    assert "launch/submit.py" in text


def test_sbatch_script_installs_with_vllm() -> None:
    """`make install` has no vLLM (the development set); the GPU nodes' venv comes from `make install-gpu`."""
    text = (LAUNCH / "slurm_ray.sbatch").read_text()
    assert "make install-gpu" in text
    assert not re.search(r"make install(?!-gpu)", text), "the sbatch file names `make install` (no vLLM)"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^install-gpu:", makefile, re.M) and '-e ".[gpu]"' in makefile


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_launchers_run_a_config_that_exists(launcher: str) -> None:
    config, overrides = split_driver_args(LAUNCHERS[launcher]())
    assert config.is_file(), config
    assert all(re.match(r"^[a-z_]+(\.[a-z_0-9]+)+=\S+$", o) for o in overrides), overrides


def test_launchers_agree_on_config_and_placement() -> None:
    runs = {name: split_driver_args(get()) for name, get in LAUNCHERS.items()}
    assert len({(c, tuple(o)) for c, o in runs.values()}) == 1, runs


def test_launcher_overrides_validate_against_the_schema() -> None:
    config, overrides = split_driver_args(kuberay_driver_args())
    cfg = load_config(config, overrides)
    assert cfg.placement.env_worker_resources == {ENV_RESOURCE: 0.01}
    assert cfg.placement.learner_num_gpus == 1  # the GPU recipe trains on GPUs


def test_dashboards_listen_on_loopback_where_the_launcher_allows() -> None:
    """The dashboard's job API runs code: loopback for `ray up` (reached through `ray dashboard`'s
    SSH tunnel) and SLURM (the batch step runs on the head); KubeRay's submitter pod needs the pod
    network, and the file says how to fence it."""
    head = yaml.safe_load((LAUNCH / "ray_cluster.yaml").read_text())["head_start_ray_commands"]
    assert any("--dashboard-host=127.0.0.1" in c for c in head), head
    sbatch = (LAUNCH / "slurm_ray.sbatch").read_text()
    assert 'DASHBOARD_HOST="${SR_DASHBOARD_HOST:-127.0.0.1}"' in sbatch
    assert '--dashboard-host="$DASHBOARD_HOST"' in sbatch
    kuberay = (LAUNCH / "kuberay_rayjob.yaml").read_text()
    assert 'dashboard-host: "0.0.0.0"' in kuberay and "NetworkPolicy" in kuberay


@pytest.mark.parametrize(("driver", "refused"), [("570.86.15", True), ("580.65.06", False), (None, False)])
def test_ray_up_nodes_refuse_an_nvidia_driver_older_than_cuda_13_needs(
    tmp_path: Path, driver, refused
) -> None:
    """torch 2.13.0's CUDA 13 needs driver R580+; a GPU node with an older one stops at its set-up
    with one line (a CPU node, without nvidia-smi, passes)."""
    (check,) = [
        c
        for c in yaml.safe_load((REPO / "launch" / "ray_cluster.yaml").read_text())["initialization_commands"]
        if "nvidia-smi" in c
    ]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if driver is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho {driver}\n")
        fake.chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", check], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert (done.returncode != 0) == refused, done.stdout + done.stderr
    assert ("older than R580" in done.stdout) == refused
