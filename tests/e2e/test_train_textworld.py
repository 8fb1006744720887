"""End to end on the second environment: configs/cpu_textworld.yaml for one iteration over real
Ray, the real TextWorld engine on generated tw-cooking games, SmolLM2 and the learner, shrunk."""

from __future__ import annotations

import json

import pytest

from selective_rollout.analysis.report import report_run
from selective_rollout.config import load_config
from selective_rollout.records import read_groups
from selective_rollout.reporting.metrics_log import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_textworld_profile_one_iteration(ray_cluster, cooking_games, tmp_path):
    from selective_rollout.driver import Driver

    run_dir = tmp_path / "run"
    cfg = load_config(
        "configs/cpu_textworld.yaml",
        [
            "env.level=easy",  # the cooking_games fixture's set
            f"env.games_dir={cooking_games}",
            "env.n_train=3",
            "env.n_valid=1",
            "env.num_workers=1",
            "rollout.group_size=3",
            "rollout.groups_per_iteration=2",
            "rollout.max_groups_in_flight=2",
            "rollout.max_steps=12",  # easy walkthroughs take 8-9 steps
            "engine.temperature=1.0",
            "rollout.audit_budget=1.0",
            "gate.k=2",
            "gate.tau=0.3",
            "warm_start.games=3",
            "warm_start.epochs=1",
            f"warm_start.cache_dir={tmp_path / 'warm'}",
            "eval.num_tasks=1",
            "driver.iterations=1",
            f"driver.run_dir={run_dir}",
            "logging.backends=[jsonl]",
            "logging.progress=false",
        ],
    )
    assert cfg.env.name == "tw-cooking" and cfg.rollout.strategy == "selective"
    driver = Driver(cfg, run_dir)
    try:
        driver.run()
        report = report_run(driver)
    finally:
        driver.close()

    (metrics,) = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["iteration"] == 0]
    assert metrics["rollout/groups_started"] >= 1 and metrics["env/steps"] > 0
    groups = [g for g in read_groups(run_dir / "rollouts.jsonl") if g.trajectories]
    assert groups and all(g.g == 3 and g.task_type == "tw-cooking-easy" for g in groups)
    assert all(g.task_id.startswith(("train/easy_s0_", "valid_unseen/easy_s0_")) for g in groups)
    steps = [s for g in groups for t in g.trajectories for s in t.steps]
    assert steps and all(s.valid for s in steps)  # constrained to the engine's admissible commands
    finished = [t for g in groups for t in g.trajectories if t.reward is not None]
    assert finished and all(t.reward == float(t.won) for t in finished)  # tw-cooking's reward rule
    assert report == run_dir / "report.md"
    summary = json.loads((run_dir / "report.json").read_text())
    assert summary["iterations"] == 1 and {"before", "after"} <= set(summary["eval"])
