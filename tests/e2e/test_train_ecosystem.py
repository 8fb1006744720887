"""End to end with environments written for other libraries, run unchanged from config lines: a
multi-turn skyrl-gym environment on rows in SkyRL's format, and a gymnasium text environment by
its id, each registered by a test module that ``env.imports`` names (as a third-party package
registers its own). One iteration over real Ray with the transformers engine, the env pool, the
coordinator and the DeepSpeed learner: the groups settle, their rewards follow the stated rule
(the sum of the steps' rewards) and split by construction, so the learner takes a real step."""

from __future__ import annotations

import json

import pytest

from selective_rollout.analysis.report import report_run
from selective_rollout.config import load_config
from selective_rollout.records import read_groups
from selective_rollout.reporting.metrics_log import read_metrics
from selective_rollout.rollout.actions import INVALID_ACTION
from tests.env import gym_doors_env, skyrl_turns_env

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ONE_ITERATION = [
    "env.num_workers=1",
    "warm_start.enabled=false",
    "rollout.strategy=none",
    "rollout.group_size=2",
    "rollout.groups_per_iteration=2",
    "rollout.max_groups_in_flight=2",
    "rollout.max_steps=3",
    "engine.temperature=1.0",
    "eval.split=test",
    "eval.num_tasks=1",
    "driver.iterations=1",
    "logging.backends=[jsonl]",
    "logging.progress=false",
]


def _train(tmp_path, overrides: list[str]):
    from selective_rollout.driver import Driver

    run_dir = tmp_path / "run"
    cfg = load_config("configs/cpu_default.yaml", [*overrides, *ONE_ITERATION, f"driver.run_dir={run_dir}"])
    driver = Driver(cfg, run_dir)
    try:
        driver.run()
        report_run(driver)
    finally:
        driver.close()
    groups = [g for g in read_groups(run_dir / "rollouts.jsonl") if g.iteration == 0]
    metrics = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["iteration"] == 0]
    return run_dir, groups, metrics


def _settled_and_trained(groups, metrics, rewards: set[float]) -> list:
    assert len(groups) == 2 and all(len(g.trajectories) == 2 for g in groups)
    played = [t for g in groups for t in g.trajectories]
    for t in played:
        assert t.reward == sum(s.reward for s in t.steps)  # the stated rule: the steps' sum
        assert t.won == (t.reward > 0)  # ended by the environment with a positive sum
    assert all({t.reward for t in g.trajectories} == rewards for g in groups)  # split, by construction
    assert any("train/loss" in m for m in metrics)  # the learner stepped on them
    return played


def test_a_skyrl_gym_environment_trains_one_iteration(ray_cluster, tmp_path):
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Tell me about the number {i}."}],
            "env_class": skyrl_turns_env.ENV_ID,
            "reward_spec": {"method": "rule", "ground_truth": str(i)},
            "extra_info": {"split": "test" if i == 9 else "train", "max_turns": 2},
        }
        for i in (1, 2, 3, 9)
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir, groups, metrics = _train(
        tmp_path,
        [
            "env.name=skyrl_gym",
            f"env.data_files=[{data}]",
            f"env.imports=[{skyrl_turns_env.__name__}]",
            "env.stop=[.]",
            "engine.max_new_tokens=12",
        ],
    )
    assert {g.task_id for g in groups} <= {"train-0", "train-1", "train-2"}
    played = _settled_and_trained(groups, metrics, {0.0, 1.0})
    # two turns each (the environment says done after its second), each reply sent as its text
    assert all(len(t.steps) == 2 and INVALID_ACTION not in {s.action for s in t.steps} for t in played)
    summary = json.loads((run_dir / "report.json").read_text())
    assert summary["eval"]["after"]["tasks"] == 1  # the held-out row of split "test"


def test_a_gymnasium_environment_trains_one_iteration(ray_cluster, tmp_path):
    _, groups, metrics = _train(
        tmp_path,
        [
            "env.name=gymnasium",
            f"env.id={gym_doors_env.ENV_ID}",
            f"env.imports=[{gym_doors_env.__name__}]",
            "env.train_seeds=4",
            "env.test_seeds=1",
        ],
    )
    assert {g.task_id for g in groups} <= {f"seed-{s}" for s in range(4)}
    played = _settled_and_trained(groups, metrics, {0.0, 1.0})
    # constrained to the commands info listed; the environment terminates after two steps
    assert all(
        len(t.steps) == 2 and {s.action for s in t.steps} <= set(gym_doors_env.COMMANDS) for t in played
    )
