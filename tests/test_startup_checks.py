"""What the driver refuses in seconds, with one line, before it would wait forever or fail late."""

from __future__ import annotations

import importlib.util
import signal

import pytest

from selective_rollout.config import load_config
from selective_rollout.placement import resource_demand, resource_shortfall
from selective_rollout.rollout.engines import check_backend_installed
from selective_rollout.train import main


def test_demand_counts_every_actor_kind():
    cfg = load_config(
        None,
        [
            "engine.num_engines=2",
            "engine.num_gpus=1",
            "trainer.num_learners=4",
            "placement.learner_num_gpus=1",
            "env.num_workers=3",
            "placement.env_worker_resources={env_node: 0.01}",
        ],
    )
    demand = resource_demand(cfg)
    assert demand["GPU"] == 6 and demand["env_node"] == pytest.approx(0.03)
    assert demand["CPU"] == 2 * 1 + 4 * 1 + 3 * 1 + 0.5
    assert resource_shortfall(demand, {"CPU": 16, "GPU": 0}) == [
        "GPU: the run asks for 6, the cluster has 0",
        "env_node: the run asks for 0.03, the cluster has 0",
    ]
    assert resource_shortfall(demand, {"CPU": 16, "GPU": 8, "env_node": 1}) == []


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_backend_without_vllm_is_one_line_before_ray(tiny_games, smollm2_path, tmp_path, capsys):
    import ray

    started, handler = ray.is_initialized(), signal.getsignal(signal.SIGTERM)
    rc = main(
        [
            "--config",
            "configs/cpu_default.yaml",
            "engine.backend=vllm",
            f"env.games_dir={tiny_games}",
            "env.preset=tiny",  # the tiny_games fixture (the profile plays medium games)
            "env.n_train=6",
            "env.n_valid=2",
            f"driver.runs_dir={tmp_path}",
        ]
    )
    signal.signal(signal.SIGTERM, handler)  # main() installs the CLI's own
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "vllm is not installed" in err[0], err
    assert ray.is_initialized() == started  # refused before Ray was started
    with pytest.raises(ValueError, match=r"engine\.backend=vllm, but vllm is not installed"):
        check_backend_installed("vllm")


@pytest.mark.ray
def test_gpu_learners_on_a_cpu_cluster_stop_with_the_numbers(ray_cluster, tiny_games, smollm2_path, tmp_path):
    from selective_rollout.driver import Driver

    cfg = load_config(
        "configs/cpu_default.yaml",
        [
            f"env.games_dir={tiny_games}",
            "env.preset=tiny",  # the tiny_games fixture (the profile plays medium games)
            "env.n_train=6",
            "env.n_valid=2",
            "placement.learner_num_gpus=1",
            f"driver.run_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(
        ValueError, match=r"cannot place this run's actors: GPU: the run asks for 1, the cluster has 0"
    ):
        Driver(cfg, tmp_path / "run")
