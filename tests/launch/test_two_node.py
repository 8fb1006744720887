"""Two Ray nodes on one machine (a head and a worker offering ``env_node``), shared by both tests:
env workers pinned by a custom resource, then one iteration of the CPU profile submitted as a job
with env workers spread over both nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from selective_rollout.reporting.metrics_log import read_metrics
from tests.launch.ray_nodes import RayNode, head_and_worker, submit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RayNode, dict[str, str]]]:
    """(head, {"head": node id, "worker": node id}); torn down by PID, survivors fail the module."""
    # logical CPUs: the training job needs an engine, a learner, the coordinator and env workers
    with head_and_worker(tmp_path_factory.mktemp("two_nodes"), 6, {"env_node": 4}, 4) as nodes:
        yield nodes


def test_env_workers_land_on_the_env_node(two_nodes, tmp_path: Path) -> None:
    head, ids = two_nodes
    games = tmp_path / "games"
    done = submit(
        head.dashboard_url,
        "--command",
        f"python launch/check_placement.py --resource env_node --workers 2 --games-dir {games}",
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("PLACEMENT ")]
    assert done.returncode == 0 and lines, head.log_tail() + done.stderr + done.stdout
    report = json.loads(lines[-1].removeprefix("PLACEMENT "))
    assert report["ok"] and report["misplaced"] == []
    assert {w["node_id"] for w in report["workers"]} == {ids["worker"]}
    assert len(report["workers"]) == 2 and report["steps"] == 4


@pytest.mark.ray
def test_one_training_iteration_with_env_workers_on_both_nodes(
    two_nodes, tiny_games: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    """``smollm2_path`` converts the model into the cache the job's driver reads (same HOME)."""
    head, ids = two_nodes
    run_dir = tmp_path / "run"
    overrides = [
        f"env.games_dir={tiny_games}",
        "env.preset=tiny",  # the tiny_games fixture (the profile plays medium games)
        "env.n_train=6",  # the tiny_games fixture's set
        "env.n_valid=2",
        "env.num_workers=2",
        "placement.env_worker_spread=true",
        "rollout.group_size=2",
        "rollout.groups_per_iteration=2",
        "rollout.max_groups_in_flight=2",
        "rollout.max_steps=3",
        "gate.k=2",
        "warm_start.enabled=false",
        "eval.num_tasks=1",
        "driver.iterations=1",
        f"driver.run_dir={run_dir}",
        "logging.backends=[jsonl]",
        "logging.progress=false",
    ]
    done = submit(
        head.dashboard_url,
        "--quiet",
        "--",
        *overrides,
        timeout_s=900,
    )
    assert done.returncode == 0, head.log_tail() + done.stderr[-4000:] + done.stdout[-4000:]

    placement = json.loads((run_dir / "placement.json").read_text())
    assert {loc["node_id"] for loc in placement["env_workers"]} == {ids["head"], ids["worker"]}
    assert {"engines", "learners", "coordinator"} <= set(placement)
    metrics = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["iteration"] == 0]
    assert metrics and metrics[0]["rollout/groups_started"] >= 2 and metrics[0]["env/steps"] > 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["iterations"] == 1 and len(report["placement"]["env_workers"]) == 2
    assert "## Placement" in (run_dir / "report.md").read_text()
