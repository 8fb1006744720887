"""End to end with an environment of another kind: arithmetic questions from a JSONL file, named
by its path (tests/env/arithmetic_env.py), trained for one iteration over real Ray with the warm
start, the env pool, the coordinator, the DeepSpeed learner and the report. Nothing in config/,
the coordinator or the driver names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selective_rollout.analysis.report import report_run
from selective_rollout.config import RunConfig, load_config
from selective_rollout.records import read_groups

pytestmark = [pytest.mark.slow, pytest.mark.ray]

QUESTIONS = [
    ("q1", "train", "What is 2 + 3?", 5, [4, 5, 6]),
    ("q2", "train", "What is 7 - 4?", 3, [2, 3, 4]),
    ("q3", "train", "What is 3 * 3?", 9, [6, 9, 12]),
    ("q4", "train", "What is 8 / 2?", 4, [2, 4, 6]),
    ("v1", "valid_unseen", "What is 6 + 1?", 7, [6, 7, 8]),
]


def arithmetic_config(tmp_path: Path, run_dir: Path, overrides: list[str]) -> RunConfig:
    """The CPU profile on the arithmetic questions (written here), small enough for one test."""
    tasks_file = tmp_path / "questions.jsonl"
    tasks_file.write_text(
        "".join(
            json.dumps({"id": i, "split": s, "question": q, "answer": a, "choices": c}) + "\n"
            for i, s, q, a, c in QUESTIONS
        )
    )
    return load_config(
        "configs/cpu_default.yaml",
        [
            "env.name=tests.env.arithmetic_env:Arithmetic",
            f"env.tasks_file={tasks_file}",
            "env.num_workers=1",
            "rollout.strategy=none",
            "rollout.group_size=3",
            "rollout.groups_per_iteration=2",
            "rollout.max_groups_in_flight=2",
            "rollout.max_steps=2",
            "engine.temperature=1.0",
            "warm_start.games=4",
            "warm_start.epochs=1",
            f"warm_start.cache_dir={tmp_path / 'warm'}",
            "eval.num_tasks=1",
            f"driver.run_dir={run_dir}",
            "logging.backends=[jsonl]",
            "logging.progress=false",
            *overrides,
        ],
    )


def test_a_jsonl_environment_trains_one_iteration(ray_cluster, tmp_path):
    from selective_rollout.driver import Driver

    run_dir = tmp_path / "run"
    cfg = arithmetic_config(tmp_path, run_dir, ["driver.iterations=1"])
    driver = Driver(cfg, run_dir)
    try:
        driver.run()
        report = report_run(driver)
    finally:
        driver.close()
    groups = [g for g in read_groups(run_dir / "rollouts.jsonl") if g.iteration == 0]
    assert groups and {g.task_id for g in groups} <= {"q1", "q2", "q3", "q4"}
    played = [t for g in groups for t in g.trajectories]
    assert all(len(t.steps) == 1 and t.steps[0].action.startswith("answer ") for t in played)
    assert all(t.reward == float(t.won) for t in played)  # the environment's own reward rule
    summary = json.loads((run_dir / "report.json").read_text())
    assert summary["iterations"] == 1 and summary["eval"]["after"]["tasks"] == 1
    assert report.read_text().startswith("# Run report")
