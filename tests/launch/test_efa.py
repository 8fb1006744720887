"""The p5 nodes of ``launch/ray_cluster.yaml`` get EFA: an interface on every network card, the
devices in their containers, and EFA's user space with NCCL's plugin in the image.

Without EFA a p5's NCCL traffic runs over TCP on its one ENA interface. No cloud or Docker here:
the files are read (the image by ``dockerfile_parse``, as ``test_dockerfiles.py`` reads it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.launch.test_dockerfiles import parse

REPO = Path(__file__).resolve().parents[2]
CLUSTER = yaml.safe_load((REPO / "launch" / "ray_cluster.yaml").read_text())
# EFA network cards per GPU instance type (EC2's NetworkInfo); a new type must be looked up and
# added here: a KeyError is this test asking for it.
EFA_CARDS = {"p5.48xlarge": 32}
EFA_RUN_OPTIONS = {"--device=/dev/infiniband", "--ulimit memlock=-1:-1"}


def node_types(gpu: bool) -> dict[str, dict]:
    return {
        name: spec
        for name, spec in CLUSTER["available_node_types"].items()
        if bool(spec["resources"].get("GPU")) == gpu
    }


def run_options(name: str) -> set[str]:
    """What ``docker run`` gets on a node of this type: the shared options, then the head's or the
    node type's worker options."""
    docker = CLUSTER["docker"]
    if name == CLUSTER["head_node_type"]:
        extra = docker.get("head_run_options", [])
    else:
        extra = CLUSTER["available_node_types"][name].get("docker", {}).get("worker_run_options", [])
    return set(docker["run_options"]) | set(extra)


@pytest.mark.parametrize("name", sorted(node_types(gpu=True)))
def test_every_network_card_of_a_gpu_node_carries_an_efa_interface(name: str) -> None:
    config = CLUSTER["available_node_types"][name]["node_config"]
    interfaces = config["NetworkInterfaces"]
    cards = EFA_CARDS[config["InstanceType"]]
    efa = sorted(i["NetworkCardIndex"] for i in interfaces if i["InterfaceType"] == "efa-only")
    (primary,) = [i for i in interfaces if i["InterfaceType"] == "interface"]
    assert efa == list(range(cards)) and len(interfaces) == cards + 1
    assert (primary["NetworkCardIndex"], primary["DeviceIndex"]) == (0, 0)
    assert len({(i["NetworkCardIndex"], i["DeviceIndex"]) for i in interfaces}) == len(interfaces)
    # Ray takes subnets and security groups from the interfaces, and refuses them on the node too
    assert {i["SubnetId"] for i in interfaces} and all(i["Groups"] for i in interfaces)
    assert not {"SubnetId", "SubnetIds", "SecurityGroupIds"} & set(config)
    assert config["Placement"]["GroupName"]  # EFA traffic stays inside a cluster placement group


def test_every_node_shares_one_subnet_and_security_group() -> None:
    """EFA needs a security group open to itself, and the env nodes must reach the GPU nodes."""
    subnets, groups = set(), set()
    for spec in CLUSTER["available_node_types"].values():
        config = spec["node_config"]
        for i in config.get("NetworkInterfaces", []):
            subnets.add(i["SubnetId"])
            groups.add(tuple(i["Groups"]))
        subnets.update(config.get("SubnetIds", []))
        if "SecurityGroupIds" in config:
            groups.add(tuple(config["SecurityGroupIds"]))
    assert len(subnets) == 1 and len(groups) == 1, (subnets, groups)


def test_nodes_with_several_interfaces_are_reached_on_private_ips() -> None:
    """EC2 gives no public IP to an instance launched with several network interfaces."""
    assert CLUSTER["provider"]["use_internal_ips"] is True


@pytest.mark.parametrize("name", sorted(CLUSTER["available_node_types"]))
def test_only_gpu_containers_get_the_efa_devices(name: str) -> None:
    """An env node has no /dev/infiniband: passing it would stop its container from starting."""
    options = run_options(name)
    if name in node_types(gpu=True):
        assert options >= EFA_RUN_OPTIONS, options
    else:
        assert not options & EFA_RUN_OPTIONS, options


def test_the_gpu_image_installs_efa_and_puts_nccls_plugin_on_the_library_path() -> None:
    structure = parse(REPO / "docker" / "Dockerfile").structure
    (install,) = [
        i["value"] for i in structure if i["instruction"] == "RUN" and "efa_installer.sh" in i["value"]
    ]
    assert {"--skip-kmod", "--skip-limit-conf", "--no-verify"} <= set(install.split())
    (version,) = [
        i["value"] for i in structure if i["instruction"] == "ARG" and "EFA_INSTALLER" in i["value"]
    ]
    assert re.fullmatch(r"EFA_INSTALLER_VERSION=\d+\.\d+\.\d+", version), version
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in install
    (library_path,) = [
        i["value"] for i in structure if i["instruction"] == "ENV" and "LD_LIBRARY_PATH" in i["value"]
    ]
    assert "/opt/amazon/ofi-nccl/lib" in library_path and "/opt/amazon/efa/lib" in library_path
    assert library_path.endswith(":${LD_LIBRARY_PATH}"), "the base image's CUDA library path is kept"
