"""Two Ray nodes on one machine: env workers must run on the node that offers ``env_node``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launch.ray_nodes import start_head, start_worker, submit, wait_for_nodes


@pytest.mark.slow
def test_env_workers_land_on_the_env_node(tmp_path: Path) -> None:
    head = start_head(tmp_path)
    worker = None
    try:
        worker = start_worker(head, tmp_path, {"env_node": 4})
        nodes = wait_for_nodes(head, 2)
        env_node = next(n.node_id for n in nodes if n.resources_total.get("env_node"))
        head_node = next(n.node_id for n in nodes if n.is_head_node)

        games = tmp_path / "games"
        done = submit(
            head.dashboard_url,
            "--command",
            f"python launch/check_placement.py --resource env_node --workers 2 --games-dir {games}",
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("PLACEMENT ")]
        assert done.returncode == 0 and lines, head.log_tail() + worker.log_tail() + done.stderr + done.stdout
        report = json.loads(lines[-1].removeprefix("PLACEMENT "))
        assert report["ok"] and report["misplaced"] == []
        assert {w["node_id"] for w in report["workers"]} == {env_node} != {head_node}
        assert len(report["workers"]) == 2 and report["steps"] == 4
    finally:
        survivors = (worker.stop() if worker else []) + head.stop()
    assert survivors == [], f"Ray processes outlived their nodes: {survivors}"
