"""placement.json -> report: nodes counted per actor kind; the spread option reaches Ray's options."""

from __future__ import annotations

from pathlib import Path

from selective_rollout.config import load_config
from selective_rollout.placement import nodes_by_kind, placement_lines, read_placement, write_placement

A = {"node_id": "aaaaaaaa1111", "node_ip": "10.0.0.1"}
B = {"node_id": "bbbbbbbb2222", "node_ip": "10.0.0.2"}


def test_nodes_are_counted_per_kind_and_rendered(tmp_path: Path) -> None:
    placement = {
        "engines": [{**A, "pid": 1, "malloc": "system"}],
        "learners": [{**B, "pid": 5, "malloc": "jemalloc"}, {**B, "pid": 6}],  # the second: an older file
        "env_workers": [{**A, "pid": 2}, {**B, "pid": 3}, {**B, "pid": 4}],
    }
    write_placement(tmp_path, placement)
    assert read_placement(tmp_path) == placement
    assert nodes_by_kind(placement) == {
        "engines": {"10.0.0.1/aaaaaaaa": 1},
        "learners": {"10.0.0.2/bbbbbbbb": 2},
        "env_workers": {"10.0.0.1/aaaaaaaa": 1, "10.0.0.2/bbbbbbbb": 2},
    }
    rows = [ln for ln in placement_lines(placement) if ln.startswith(("| env_workers", "| learners"))]
    assert rows == [
        "| learners | 2 | 1 | 10.0.0.2/bbbbbbbb x2 | jemalloc x1 |",
        "| env_workers | 3 | 2 | 10.0.0.1/aaaaaaaa x1, 10.0.0.2/bbbbbbbb x2 | - |",
    ]


def test_no_placement_file_means_no_section(tmp_path: Path) -> None:
    assert read_placement(tmp_path) == {} and placement_lines({}) == []


def test_spread_sets_the_scheduling_strategy_only_when_asked() -> None:
    packed = load_config("configs/cpu_default.yaml", []).placement.env_worker_options()
    spread_overrides = ["placement.env_worker_spread=true", "placement.env_worker_resources={x: 1}"]
    spread = load_config("configs/cpu_default.yaml", spread_overrides).placement.env_worker_options()
    assert "scheduling_strategy" not in packed
    assert spread["scheduling_strategy"] == "SPREAD" and spread["resources"] == {"x": 1.0}
